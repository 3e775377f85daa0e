"""Fixtures: a fresh, migrated database per test on the real PostgreSQL of
``scripts/services.sh up`` (``ONCEFLOW_TEST_DATABASE_URL``), and a local
mail service that counts what it is sent."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = REPO / "migrations"
KEY_VECTORS = REPO / "pkg" / "effects" / "testdata" / "keys.json"
EXAMPLES = REPO / "python" / "examples"


def admin_url() -> str:
    url = os.environ.get("ONCEFLOW_TEST_DATABASE_URL", "")
    if not url:
        raise RuntimeError(
            "ONCEFLOW_TEST_DATABASE_URL is not set: run the tests with `make test-python`, "
            'or eval "$(scripts/services.sh up pg)" first'
        )
    return url


def with_database(url: str, name: str) -> str:
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, "/" + name, u.query, u.fragment))


def _template(admin: str) -> str:
    ups = sorted(MIGRATIONS.glob("*.up.sql"))
    body = "".join(p.read_text() for p in ups)
    name = "onceflow_pytpl_" + hashlib.sha256(body.encode()).hexdigest()[:16]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(7355609)")  # one builder at a time
        try:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = %s AND datistemplate)", (name,)
            ).fetchone()
            if row is not None and row[0]:
                return name
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            # Each file as the Go migrator runs it: in a transaction of its
            # own, except a file marked disable-tx (it manages its own
            # transactions, e.g. to build an index CONCURRENTLY).
            with psycopg.connect(with_database(admin, name), autocommit=True) as tc:
                tc.execute("CREATE SCHEMA IF NOT EXISTS onceflow")
                for p in ups:
                    text = p.read_text()
                    if text.startswith("---- tern: disable-tx ----"):
                        _run_statement_by_statement(with_database(admin, name), p)
                    else:
                        with tc.transaction():
                            tc.execute(text.encode())
            conn.execute(sql.SQL("ALTER DATABASE {} WITH is_template true").format(sql.Identifier(name)))
            return name
        finally:
            conn.execute("SELECT pg_advisory_unlock(7355609)")


def _run_statement_by_statement(url: str, path: Path) -> None:
    """Runs a disable-tx migration one statement at a time, as the Go
    migrator does (a statement such as CREATE INDEX CONCURRENTLY cannot run in
    the implicit transaction of a multi-statement query): psql splits the
    file, dollar quotes and comments included."""
    psql = shutil.which("psql")
    if psql is None:
        raise RuntimeError("psql (PostgreSQL's client) is needed to apply " + path.name + "; scripts/require.sh postgres installs it")
    done = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{path.name}: psql exited {done.returncode}: {done.stderr.strip()}")


_template_name: str | None = None


@pytest.fixture
def db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database holding onceflow's migrated schema; dropped after."""
    global _template_name
    admin = admin_url()
    if _template_name is None:
        _template_name = _template(admin)
    name = "py_" + secrets.token_hex(4) + "_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:30]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(_template_name))
        )
    try:
        yield with_database(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@dataclass
class MailService:
    """A mail service that dedups nothing: it counts every e-mail it is sent."""

    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: list[tuple[str | None, dict[str, str]]] = field(default_factory=list)

    def count(self) -> int:
        with self.lock:
            return len(self.sent)

    def keys(self) -> list[str | None]:
        with self.lock:
            return [k for k, _ in self.sent]

    def to(self) -> list[str]:
        with self.lock:
            return [e["to"] for _, e in self.sent]


@pytest.fixture
def mail() -> Iterator[MailService]:
    svc = MailService()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with svc.lock:
                svc.sent.append((self.headers.get("Idempotency-Key"), body))
                msg_id = f"msg-{len(svc.sent)}"
            out = json.dumps({"id": msg_id}).encode()
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    svc.url = f"http://127.0.0.1:{server.server_address[1]}/send"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield svc
    finally:
        server.shutdown()
        server.server_close()
