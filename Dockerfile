# The example project (example/proj) with cron_celery installed from this checkout.
# One image for every role: web (gunicorn), worker and beat differ only by command.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app

WORKDIR /app
COPY pyproject.toml README.pypi.md LICENSE ./
COPY cron_celery ./cron_celery
RUN pip install ".[prometheus,sentry]" "gunicorn>=22,<24"

COPY example ./example
WORKDIR /app/example
ENV DJANGO_SETTINGS_MODULE=proj.settings \
    STATIC_ROOT=/app/static
RUN mkdir -p /app/static && python manage.py collectstatic --noinput --verbosity 0 && chown -R app /app/static

USER app
EXPOSE 8000
CMD ["gunicorn", "proj.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "2", "--access-logfile", "-"]
