#!/usr/bin/env bash
# The set-up of docker-compose.yaml without Docker, for one machine: PostgreSQL from the
# distribution's package (Debian: apt-get install postgresql) in DIR/pg, MLflow's tracking
# server in the foreground on 127.0.0.1:PORT, artifacts served from DIR/artifacts. Ctrl-C
# stops both. Running it again on the same DIR reuses the database.
#
#   deploy/mlflow/local-server.sh DIR [PORT]         # PORT defaults to 5000
#   export MLFLOW_TRACKING_URI=http://127.0.0.1:5000  # or tracking.uri=http://127.0.0.1:5000
#
# PostgreSQL listens on 127.0.0.1 only (port PORT+1 unless PG_PORT is set), trusts local
# connections and has no password: it is reachable from this machine only, like the MLflow
# port. As root, PostgreSQL runs as the `postgres` user (it refuses to run as root).
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

mkdir -p "$dir/pg" "$dir/artifacts"
dir=$(cd "$dir" && pwd)
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chmod a+x "$dir" && chown postgres: "$dir/pg"
  as_pg=(runuser -u postgres --)
  "${as_pg[@]}" test -w "$dir/pg" || { echo "user postgres cannot reach $dir/pg: pick a DIR outside private folders" >&2; exit 2; }
fi
if [ ! -f "$dir/pg/data/PG_VERSION" ]; then
  "${as_pg[@]}" "$bin/initdb" -D "$dir/pg/data" -U mlflow -A trust -E UTF8 >/dev/null
fi
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/postgres.log" -w \
  -o "-p $pg_port -k $dir/pg -c listen_addresses=127.0.0.1" start >/dev/null
stop_pg() { "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null || true; }
trap stop_pg EXIT
"${as_pg[@]}" "$bin/createdb" -h 127.0.0.1 -p "$pg_port" -U mlflow mlflow 2>/dev/null || true  # exists already

echo "PostgreSQL on 127.0.0.1:$pg_port (data in $dir/pg); MLflow on http://127.0.0.1:$port"
# postgresql:// is psycopg 3 under SQLAlchemy 2.1, psycopg2 before; name the installed one.
driver=postgresql
if ! "$python" -c "import psycopg" 2>/dev/null && "$python" -c "import psycopg2" 2>/dev/null; then
  driver=postgresql+psycopg2
fi
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} "$python" -m mlflow server \
  --backend-store-uri "$driver://mlflow@127.0.0.1:$pg_port/mlflow" \
  --artifacts-destination "$dir/artifacts" --serve-artifacts \
  --host 127.0.0.1 --port "$port" --workers 1
