#!/usr/bin/env bash
# Installs the Debian packages the tests need (chromium renders the HTML report headless; postgresql gives the
# throwaway test cluster of scripts/throwaway-pg.sh where no server runs). Idempotent: does nothing
# when they are already there. Needs root (CI runs as root); without root it says what to install and exits 0 so a
# developer without sudo can still run the rest of the suite.
set -euo pipefail
PACKAGES=(chromium postgresql)
missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "system-deps: no apt-get here; install ${missing[*]} with your package manager" >&2
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: run as root (or: sudo apt-get install -y ${missing[*]})" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "system-deps: installed ${missing[*]}"
