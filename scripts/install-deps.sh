#!/bin/sh
# Installs every Debian 12 package llmgw needs to build, test, fuzz and
# benchmark. Idempotent: apt-get skips what is already there.
#
# One wrinkle: Debian's libmsgpack-cxx-dev depends on libboost-dev, which is
# Boost 1.74, while llmgw needs Boost 1.81 (Boost.JSON) and libboost1.81-dev
# conflicts with libboost1.74-dev. msgpack-c is used here without Boost
# (MSGPACK_NO_BOOST), so a tiny local package that provides libboost-dev on
# top of libboost1.81-dev satisfies the dependency honestly.
set -eu

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps.sh: run as root (it calls apt-get)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends libboost1.81-dev

if ! dpkg-query -W -f='${Status}' llmgw-boost-shim 2>/dev/null | grep -q "ok installed"; then
  shim=$(mktemp -d)
  mkdir -p "$shim/DEBIAN"
  cat > "$shim/DEBIAN/control" <<CONTROL
Package: llmgw-boost-shim
Version: 1.81.0
Architecture: all
Maintainer: llmgw developers <llmgw@localhost>
Depends: libboost1.81-dev
Provides: libboost-dev
Description: lets libmsgpack-cxx-dev install next to Boost 1.81
 msgpack-c is header-only and llmgw builds it with MSGPACK_NO_BOOST.
CONTROL
  dpkg-deb --build "$shim" "$shim.deb" >/dev/null
  dpkg -i "$shim.deb"
  rm -rf "$shim" "$shim.deb"
fi

apt-get install -y -q --no-install-recommends \
  build-essential cmake ninja-build ccache pkg-config git \
  clang clang-14 libclang-rt-14-dev clang-format clang-tidy \
  libcaf-dev \
  libzmq3-dev cppzmq-dev \
  libmsgpack-cxx-dev \
  libssl-dev \
  libcli11-dev libfmt-dev \
  libgtest-dev libgmock-dev \
  libboost-json1.81-dev libtoml11-dev libxxhash-dev \
  python3 python3-cbor2 python3-zmq python3-msgpack \
  curl nginx-light
