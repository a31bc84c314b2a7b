from django.db import models
from django_tenants.models import DomainMixin, TenantMixin


class Client(TenantMixin):  # type: ignore[misc]
    name = models.CharField(max_length=100)
    auto_create_schema = True


class Domain(DomainMixin):  # type: ignore[misc]
    pass
