#!/usr/bin/env bash
# Build a base image for docker/Dockerfile from Debian's packages, without a container registry:
# debootstrap a minimal Debian bookworm with its Python 3.11, then `docker import` the tree.
#
#   docker/build_base.sh                        # -> ppoflow-base:bookworm
#   docker/build_base.sh my-base:tag            # another tag
#   DEBIAN_MIRROR=http://mirror.example/debian docker/build_base.sh
#
# Then build the images on it (docker/README.md, "Offline builds"):
#
#   docker build --network host --build-arg BASE_IMAGE=ppoflow-base:bookworm \
#       --build-arg TORCH_INDEX_URL= -f docker/Dockerfile -t ppoflow:cpu .
#
# It stands in for python:3.11-slim-bookworm: the same Debian release and Python minor version,
# `python` on PATH (python-is-python3), `python -m venv` (python3-venv), Python's C headers for
# the DeepSpeed ops the builder stage compiles (python3-dev; the slim image has them too), and
# the image's PATH and LANG. The Dockerfile's builder installs build-essential itself with apt.
# Python is Debian's /usr/bin/python3.11 rather than the slim image's /usr/local build; the
# builder's and the runtime's base are the same image, so /opt/venv's interpreter link holds.
# The building host's local CA certificates (LOCAL_CA_DIR, default /usr/local/share/ca-certificates,
# e.g. a TLS-intercepting proxy's) are added to the image's trust store, and pip, requests and
# Python's ssl read that store (PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE): pip in the build then
# reaches PyPI as the host does. LOCAL_CA_DIR= leaves them out.
# Needs root (debootstrap), debootstrap and a running Docker daemon; about a minute, 230 MB.
set -euo pipefail

tag=${1:-ppoflow-base:bookworm}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ca_dir=${LOCAL_CA_DIR-/usr/local/share/ca-certificates}
packages=python3,python3-venv,python3-dev,python-is-python3,ca-certificates

for tool in debootstrap docker; do
    command -v "$tool" >/dev/null || { echo "build_base.sh: $tool is not installed" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "build_base.sh: debootstrap needs root" >&2; exit 1; }

root=$(mktemp -d "${TMPDIR:-/var/tmp}/ppoflow-base.XXXXXX")
trap 'rm -rf --one-file-system "$root"' EXIT
chmod 755 "$root"  # the image's /: mktemp makes it 700, which locks every user but root out

debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror"
# what the image does not need: downloaded packages, package lists, logs
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log \
    "$root"/var/log/apt/* "$root"/debootstrap
# apt in a derived image reads the same mirror
echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"

changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')
if [ -n "$ca_dir" ] && compgen -G "$ca_dir/*.crt" >/dev/null; then
    cp "$ca_dir"/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates
    bundle=/etc/ssl/certs/ca-certificates.crt
    changes+=(--change "ENV PIP_CERT=$bundle REQUESTS_CA_BUNDLE=$bundle SSL_CERT_FILE=$bundle")
fi

tar -C "$root" --numeric-owner -c . | docker import "${changes[@]}" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase $suite $mirror + $packages" \
    - "$tag"
docker image ls "$tag"
