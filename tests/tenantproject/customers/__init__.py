"""The tenants of the project (django-tenants' tenant and domain models), in the public schema."""
