#!/usr/bin/env bash
# Freeze meshctl: dist/meshctl (one file) and dist/meshctl-tree/ (the same build unpacked, with its
# manifest), from one PyInstaller analysis. Needs the project installed with the `build` extra.
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
# setuptools stages the install in $root/build (git-ignored): a stale copy there would put modules
# deleted since into the frozen build, so it goes before and after.
rm -rf "$root/build"
python -m pip install --quiet --no-deps --no-build-isolation --target "$site" "$root"
rm -rf "$root/build"
export MESHCTL_FREEZE_SITE="$site"
# Reproducible output (PyInstaller's advice): without a fixed hash seed the order of modules in
# base_library.zip changes from build to build, and with it the tree's digest and the image's.
export PYTHONHASHSEED=0
python -m PyInstaller --noconfirm --clean --log-level WARN \
  --workpath "$work" --distpath "$root/dist" "$here/meshctl.spec"
end=$(date +%s)
size=$(stat -c %s "$root/dist/meshctl")
tree=$(du -sm "$root/dist/meshctl-tree" | cut -f1)
echo "built dist/meshctl: $((size / 1024 / 1024)) MiB, dist/meshctl-tree: $tree MiB, in $((end - start)) s"
