#!/usr/bin/env bash
# Installs the Debian packages the integration tests need, once: PostgreSQL (MLflow server
# test) and Chromium + ChromeDriver (MLflow UI browser check). Skips what is already there.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "tests/setup_services.sh: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
    exit 0
  fi
  echo "installing ${need[*]} (Debian packages) for the integration tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
