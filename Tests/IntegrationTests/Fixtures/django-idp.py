"""A real OAuth2 authorization server for the fleet tests: django-oauth-toolkit 3.x under gunicorn.

Run with the virtualenv's python (scripts/install-deps makes it):

  django-idp.py serve DIR --bind ADDRESS --port PORT --access-token-seconds N --grace-seconds N
      Generates a Django project in DIR (SQLite), with refresh-token rotation and reuse protection,
      makes a user, a confidential client (its secret stored in plain: hashing costs 0.3 s a request)
      and a first refresh token (a password grant through DOT's own view), prints them as one JSON
      line on stdout, then becomes gunicorn (exec: the PID stays this one, so it is stopped by PID).
  django-idp.py state DIR
      Prints the IdP's own record as one JSON line: every refresh token (created, revoked, whether a
      refresh consumed it) and every access token ever issued (created, expires, and when rotation or
      a revocation deleted it; the generated triggers keep that history), and the token requests
      gunicorn logged.

Tokens and the client secret go to stdout only as that JSON, never to the log.
"""

import argparse
import datetime
import json
import os
import secrets
import sqlite3
import sys

SETTINGS = """
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "fleet-test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = {allowed_hosts!r}
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "idpproj.urls"
WSGI_APPLICATION = "idpproj.wsgi.application"
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": str(BASE_DIR / "db.sqlite3"),
    "OPTIONS": {{"timeout": 30, "init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"}},
}}}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {{"version": 1, "disable_existing_loggers": False,
           "handlers": {{"console": {{"class": "logging.StreamHandler"}}}},
           "root": {{"handlers": ["console"], "level": "WARNING"}}}}
OAUTH2_PROVIDER = {{
    "ACCESS_TOKEN_EXPIRE_SECONDS": {access_token_seconds},
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": {grace_seconds},
    "SCOPES": {{"read": "Reading scope", "introspection": "Introspect tokens"}},
    "DEFAULT_SCOPES": ["read"],
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": False,
}}
"""

URLS = """
from django.urls import include, path
urlpatterns = [path("o/", include("oauth2_provider.urls", namespace="oauth2_provider"))]
"""

WSGI = """
import os
from django.core.wsgi import get_wsgi_application
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idpproj.settings")
application = get_wsgi_application()
"""

# DOT deletes an access token when it revokes it (rotation deletes the previous one): these
# triggers keep every access token's life, so that an answer can be checked against the instant
# it was served, and which refresh token each one came from.
HISTORY = """
CREATE TABLE IF NOT EXISTS fleet_test_accesstoken_history (
    id INTEGER PRIMARY KEY, token TEXT, created TEXT, expires TEXT, source_refresh_token_id INTEGER, deleted TEXT);
CREATE TRIGGER IF NOT EXISTS fleet_test_accesstoken_born AFTER INSERT ON oauth2_provider_accesstoken BEGIN
    INSERT INTO fleet_test_accesstoken_history (id, token, created, expires, source_refresh_token_id)
    VALUES (new.id, new.token, new.created, new.expires, new.source_refresh_token_id);
END;
CREATE TRIGGER IF NOT EXISTS fleet_test_accesstoken_changed AFTER UPDATE ON oauth2_provider_accesstoken BEGIN
    UPDATE fleet_test_accesstoken_history SET token = new.token, expires = new.expires WHERE id = new.id;
END;
CREATE TRIGGER IF NOT EXISTS fleet_test_accesstoken_deleted AFTER DELETE ON oauth2_provider_accesstoken BEGIN
    UPDATE fleet_test_accesstoken_history SET deleted = strftime('%Y-%m-%d %H:%M:%f', 'now') WHERE id = old.id;
END;
"""


def serve(arguments):
    directory = os.path.abspath(arguments.directory)
    project = os.path.join(directory, "idpproj")
    os.makedirs(project, exist_ok=True)
    files = {
        "__init__.py": "",
        "settings.py": SETTINGS.format(
            allowed_hosts=[arguments.bind, "127.0.0.1", "localhost"],
            access_token_seconds=arguments.access_token_seconds,
            grace_seconds=arguments.grace_seconds,
        ),
        "urls.py": URLS,
        "wsgi.py": WSGI,
    }
    for name, text in files.items():
        with open(os.path.join(project, name), "w") as file:
            file.write(text)
    sys.path.insert(0, directory)
    os.environ["DJANGO_SETTINGS_MODULE"] = "idpproj.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from oauth2_provider.models import get_application_model

    call_command("migrate", interactive=False, verbosity=0)
    connection.ensure_connection()
    connection.connection.executescript(HISTORY)

    password = secrets.token_urlsafe(16)
    client_secret = secrets.token_urlsafe(24)
    user, _ = get_user_model().objects.get_or_create(username="fleet")
    user.set_password(password)
    user.save()
    Application = get_application_model()
    Application.objects.filter(client_id="fleet-client").delete()
    Application.objects.create(
        client_id="fleet-client",
        name="fleet",
        user=user,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_PASSWORD,
        client_secret=client_secret,
        hash_client_secret=False,
        redirect_uris="",
    )
    # The first refresh token, from a password grant through DOT's own token view.
    answer = Client(HTTP_HOST="127.0.0.1").post(
        "/o/token/",
        {"grant_type": "password", "username": "fleet", "password": password, "scope": "read introspection"},
        HTTP_AUTHORIZATION="Basic " + __import__("base64").b64encode(f"fleet-client:{client_secret}".encode()).decode(),
    )
    if answer.status_code != 200:
        sys.exit(f"the password grant failed: HTTP {answer.status_code}")
    first = answer.json()
    connection.close()

    print(
        json.dumps(
            {
                "client_id": "fleet-client",
                "client_secret": client_secret,
                "refresh_token": first["refresh_token"],
                "access_token_seconds": arguments.access_token_seconds,
                "grace_seconds": arguments.grace_seconds,
            }
        ),
        flush=True,
    )
    gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
    os.chdir(directory)
    os.execv(
        gunicorn,
        [
            gunicorn, "--no-control-socket", "idpproj.wsgi:application", "--chdir", directory,
            "--bind", f"{arguments.bind}:{arguments.port}", "--workers", "2",
            "--access-logfile", os.path.join(directory, "access.log"),
        ],
    )


def instant(text):
    """Seconds since 1970 of a time SQLite or Django wrote (UTC, no zone)."""
    if text is None:
        return None
    text = text.replace("T", " ").split("+")[0]
    form = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
    return datetime.datetime.strptime(text, form).replace(tzinfo=datetime.timezone.utc).timestamp()


def state(arguments):
    directory = os.path.abspath(arguments.directory)
    database = sqlite3.connect(f"file:{os.path.join(directory, 'db.sqlite3')}?mode=ro", uri=True, timeout=30)
    consumed = {
        row[0]
        for row in database.execute(
            "SELECT source_refresh_token_id FROM fleet_test_accesstoken_history WHERE source_refresh_token_id IS NOT NULL"
        )
    }
    refresh_tokens = [
        {"id": row[0], "created": instant(row[1]), "revoked": instant(row[2]), "consumed": row[0] in consumed}
        for row in database.execute("SELECT id, created, revoked FROM oauth2_provider_refreshtoken ORDER BY id")
    ]
    access_tokens = [
        {"token": row[0], "created": instant(row[1]), "expires": instant(row[2]), "deleted": instant(row[3])}
        for row in database.execute(
            "SELECT token, created, expires, deleted FROM fleet_test_accesstoken_history ORDER BY id"
        )
    ]
    requests = 0
    log = os.path.join(directory, "access.log")
    if os.path.exists(log):
        with open(log) as file:
            requests = sum(1 for line in file if '"POST /o/token/' in line)
    print(json.dumps({"refresh_tokens": refresh_tokens, "access_tokens": access_tokens, "token_requests": requests}))


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve")
    serving.add_argument("directory")
    serving.add_argument("--bind", required=True)
    serving.add_argument("--port", type=int, required=True)
    serving.add_argument("--access-token-seconds", type=int, default=4)
    serving.add_argument("--grace-seconds", type=int, default=0)
    reading = commands.add_parser("state")
    reading.add_argument("directory")
    arguments = parser.parse_args()
    serve(arguments) if arguments.command == "serve" else state(arguments)


if __name__ == "__main__":
    main()
