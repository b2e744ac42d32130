#!/usr/bin/env bash
# The set-up of docker-compose.yaml without Docker, for one machine: PostgreSQL from the
# distribution's package (Debian: apt-get install postgresql) in DIR/pg, MLflow's tracking
# server in the foreground on 127.0.0.1:PORT, artifacts served from DIR/artifacts. Ctrl-C
# stops both. Running it again on the same DIR reuses the database.
#
#   deploy/mlflow/local-server.sh DIR [PORT]         # PORT defaults to 5000
#   export MLFLOW_TRACKING_URI=http://127.0.0.1:5000  # or tracking.uri=http://127.0.0.1:5000
#
# PostgreSQL listens on 127.0.0.1 only (port PORT+1 unless PG_PORT is set) and asks every
# connection for a password (scram-sha-256): its superuser's is DIR/pg/admin.password, and MLflow
# connects as `mlflow`, a role that owns the mlflow database and nothing else (no superuser: it
# cannot run programs on this machine through COPY ... TO PROGRAM), with the password in
# DIR/pg/pgpass (libpq reads it, so it is in no process's arguments). Those files are 0600.
# MLflow itself has no authentication here, so it listens on 127.0.0.1 only: anyone with a
# shell on this machine can reach it. For a shared machine, use docker-compose.yaml (basic auth).
# As root, PostgreSQL runs as the `postgres` user (it refuses to run as root).
# PYTHON (default: python3) names the interpreter that has MLflow, e.g. PYTHON=.venv/bin/python.
set -euo pipefail
dir=${1:?usage: $0 DIR [PORT]}
port=${2:-5000}
pg_port=${PG_PORT:-$((port + 1))}
python=${PYTHON:-python3}
"$python" -c "import mlflow" 2>/dev/null || { echo "$python has no mlflow: set PYTHON=.venv/bin/python" >&2; exit 2; }
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$bin" ] || bin=$(dirname "$(command -v initdb || echo /missing/initdb)")
[ -x "$bin/initdb" ] || { echo "PostgreSQL not found: apt-get install postgresql" >&2; exit 2; }

umask 077  # the password files, the database and the artifacts: this user's alone
mkdir -p "$dir/pg" "$dir/artifacts"
dir=$(cd "$dir" && pwd)
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chmod a+x "$dir" && chown postgres: "$dir/pg"
  as_pg=(runuser -u postgres --)
  "${as_pg[@]}" test -w "$dir/pg" || { echo "user postgres cannot reach $dir/pg: pick a DIR outside private folders" >&2; exit 2; }
fi
if [ -f "$dir/pg/data/PG_VERSION" ] && [ ! -f "$dir/pg/admin.password" ]; then
  echo "$dir/pg was made without passwords (by an earlier version of this script): use a new DIR" >&2
  exit 2
fi
if [ ! -f "$dir/pg/data/PG_VERSION" ]; then
  for who in admin mlflow; do
    "$python" -c "import secrets; print(secrets.token_urlsafe(32))" >"$dir/pg/$who.password"
  done
  [ ${#as_pg[@]} = 0 ] || chown postgres: "$dir/pg/admin.password"
  "${as_pg[@]}" "$bin/initdb" -D "$dir/pg/data" -U postgres -A scram-sha-256 \
    --pwfile "$dir/pg/admin.password" -E UTF8 >/dev/null
fi
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/postgres.log" -w \
  -o "-p $pg_port -k $dir/pg -c listen_addresses=127.0.0.1" start >/dev/null
stop_pg() { "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null || true; }
trap stop_pg EXIT
# postgresql:// is psycopg 3 under SQLAlchemy 2.1, psycopg2 before; name the installed one.
driver=postgresql
if ! "$python" -c "import psycopg" 2>/dev/null && "$python" -c "import psycopg2" 2>/dev/null; then
  driver=postgresql+psycopg2
fi
# The role and database MLflow uses (once), and the pgpass file it connects with.
PG_DIR="$dir/pg" PG_PORT="$pg_port" PG_DRIVER="$driver" "$python" - <<'EOF'
import os
from pathlib import Path

import sqlalchemy as sa

folder, port = Path(os.environ["PG_DIR"]), int(os.environ["PG_PORT"])
admin, mlflow = ((folder / f"{who}.password").read_text().strip() for who in ("admin", "mlflow"))
url = sa.URL.create(os.environ["PG_DRIVER"], "postgres", admin, "127.0.0.1", port, "postgres")
engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
with engine.connect() as db:
    if not db.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = 'mlflow'")).first():
        # token_urlsafe: letters, digits, - and _, safe inside a quoted literal
        db.execute(sa.text(f"CREATE ROLE mlflow LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{mlflow}'"))
    if not db.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = 'mlflow'")).first():
        db.execute(sa.text("CREATE DATABASE mlflow OWNER mlflow"))
engine.dispose()
(folder / "pgpass").write_text(f"127.0.0.1:{port}:mlflow:mlflow:{mlflow}\n")
(folder / "pgpass").chmod(0o600)
EOF

echo "PostgreSQL on 127.0.0.1:$pg_port (data in $dir/pg); MLflow on http://127.0.0.1:$port"
echo "warning: this MLflow has no authentication: anyone with a shell on this machine can read and change its runs" >&2
PGPASSFILE="$dir/pg/pgpass" MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} "$python" -m mlflow server \
  --backend-store-uri "$driver://mlflow@127.0.0.1:$pg_port/mlflow" \
  --artifacts-destination "$dir/artifacts" --serve-artifacts \
  --host 127.0.0.1 --port "$port" --workers 1
