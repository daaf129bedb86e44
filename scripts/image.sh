#!/usr/bin/env bash
# The container image the manifests in deploy/ run, built from this checkout's Dockerfile.
# Its reference (registry/name:tag) is written in ONE place, deploy/IMAGE; every manifest
# line that names it carries the marker comment "# gcs image (deploy/IMAGE)".
#
#   scripts/image.sh build          docker build -t "$(cat deploy/IMAGE)" .
#   scripts/image.sh push           docker push the same reference
#   scripts/image.sh set REF        write REF to deploy/IMAGE and into every marked manifest line
#   scripts/image.sh check          exit 1 if a marked manifest line names another image
#   scripts/image.sh name           print the reference
#
# DOCKER (default: docker) names the client, e.g. DOCKER=podman.  Untested here: the machine
# this was written on has no docker; `check` and `set` are tested (tests/cli/test_image_script.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
image_file="$root/deploy/IMAGE"
marker="# gcs image (deploy/IMAGE)"
docker="${DOCKER:-docker}"

image() { tr -d '[:space:]' < "$image_file"; }

manifests() { grep -rlF --include='*.yaml' -- "$marker" "$root/deploy" || true; }

check() {
  local want bad=0 file line ref
  want="$(image)"
  while IFS= read -r file; do
    while IFS= read -r line; do
      ref="$(sed -E 's/^[[:space:]]*image:[[:space:]]*([^[:space:]#]+).*/\1/' <<<"$line")"
      if [ "$ref" != "$want" ]; then
        echo "${file#"$root"/}: names $ref, deploy/IMAGE says $want (run: scripts/image.sh set $want)" >&2
        bad=1
      fi
    done < <(grep -F -- "$marker" "$file")
  done < <(manifests)
  return "$bad"
}

case "${1:-}" in
  name) image ;;
  build)
    check
    "$docker" build -t "$(image)" "$root"
    ;;
  push) "$docker" push "$(image)" ;;
  set)
    ref="${2:?usage: scripts/image.sh set REGISTRY/NAME:TAG}"
    if ! [[ "$ref" =~ ^[a-z0-9][a-z0-9._/-]*(:[0-9]+)?[a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]]; then
      echo "scripts/image.sh set: '$ref' is not REGISTRY/NAME:TAG" >&2
      exit 2
    fi
    printf '%s\n' "$ref" > "$image_file"
    while IFS= read -r file; do
      sed -i -E "/gcs image \(deploy\/IMAGE\)/ s|^([[:space:]]*image:[[:space:]]*)[^[:space:]#]+|\1${ref}|" "$file"
    done < <(manifests)
    check
    ;;
  check) check ;;
  *)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
