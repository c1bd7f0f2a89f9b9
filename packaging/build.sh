#!/usr/bin/env bash
# Freeze meshctl into dist/meshctl (one file). Needs the project installed with the `build` extra.
# PyInstaller's work dir lives outside the repo so a clean clone stays clean.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cache="${MESHCTL_BUILD_CACHE:-$HOME/.cache/meshctl-build}/pyinstaller"
mkdir -p "$cache"
# One directory per build: builds from several checkouts share the cache folder, and a fixed
# site dir removed by one build mid-way through another's analysis froze a binary without
# meshctl's modules. (--clean reuses nothing from a previous build anyway.)
work="$(mktemp -d "$cache/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
site="$work/site"
python -m pip install --quiet --no-deps --no-build-isolation --target "$site" "$root"
export MESHCTL_FREEZE_SITE="$site"
python -m PyInstaller --noconfirm --clean --log-level WARN \
  --workpath "$work" --distpath "$root/dist" "$here/meshctl.spec"
end=$(date +%s)
size=$(stat -c %s "$root/dist/meshctl")
echo "built dist/meshctl: $((size / 1024 / 1024)) MiB in $((end - start)) s"
