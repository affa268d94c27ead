#!/usr/bin/env bash
# Real services the signals tests start on 127.0.0.1: Redis 7 and Prometheus 2.42 (with promtool), from Debian.
# Idempotent: installs only what is missing; runs `apt-get update` only when the install needs it.
set -euo pipefail

packages=()
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    packages+=(prometheus)
fi
if [ "${#packages[@]}" -eq 0 ]; then
    echo "services: redis-server, prometheus and promtool already installed"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
install() { "${sudo[@]}" apt-get install -y --no-install-recommends "${packages[@]}"; }
if ! install; then
    "${sudo[@]}" apt-get update
    install
fi
# The Debian packages enable system services; the tests start their own instances, so stop those if running.
for unit in redis-server prometheus; do
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
        "${sudo[@]}" systemctl stop "$unit" || true
    fi
done
redis-server --version
prometheus --version 2>&1 | head -1
