#!/usr/bin/env bash
# Builds UCX, NIXL (with its UCX backend plugin) and libnixl_capi.so (NIXL's
# C API wrapper, src/bindings/rust/wrapper.cpp, which the nixl kvtransfer
# transport dlopens) from source into one prefix. Dockerfile.cuda runs this
# script; `make test-nixl NIXL_PREFIX=...` uses what it installs.
#
#   scripts/build-nixl.sh --prefix=DIR (--download | --ucx-src=DIR --nixl-src=DIR)
#       [--ucx-prefix=DIR] [--with-cuda=DIR] [--subprojects=DIR] [--work-dir=DIR] [--jobs=N]
#
#   --prefix=DIR       where NIXL and libnixl_capi.so go (libraries in DIR/lib,
#                      NIXL's plugins in DIR/lib/plugins, headers in DIR/include)
#   --ucx-prefix=DIR   where UCX goes (default: the same prefix)
#   --download         fetch UCX's release tarball and NIXL's git tag (needs
#                      network; also NIXL_BUILD_DOWNLOAD=1), into --work-dir
#   --ucx-src=DIR      an unpacked UCX source tree (a release tarball, or a git
#                      checkout: ./autogen.sh is run when there is no configure)
#   --nixl-src=DIR     an unpacked NIXL source tree
#   --with-cuda=DIR    build UCX's and NIXL's CUDA support against the CUDA
#                      toolkit in DIR (default: host memory only, no CUDA)
#   --subprojects=DIR  directories copied into NIXL's subprojects/ before the
#                      build (abseil-cpp-*, asio-*, taskflow-*, with their meson
#                      build files), for a build without network; with network
#                      meson downloads them itself
#   --work-dir=DIR     build directories and downloads (default: a temporary
#                      directory, removed at the end)
#   --jobs=N           parallel jobs (default: nproc)
#
# Versions (for --download): UCX_VERSION (default 1.19.0, the UCX NIXL 0.7.1
# is tested with) and NIXL_VERSION (default 0.7.1). Build dependencies
# (Debian/Ubuntu): autoconf automake libtool make g++ pkg-config libnuma-dev
# meson ninja-build python3-dev pybind11-dev (NIXL's meson build always
# builds its python bindings), curl and git for --download.
#
# The build leaves out what the transport does not use: NIXL's tests,
# examples, GDS and Mooncake backends; UCX's Go and Java bindings; CUDA
# unless --with-cuda is given. The NIXL tree is changed in place: the
# --subprojects are copied in, and sources older than 0.10.0 get the one
# line of NIXL's later fix that initialises useEtcd (see below).
set -euo pipefail

UCX_VERSION=${UCX_VERSION:-1.19.0}
NIXL_VERSION=${NIXL_VERSION:-0.7.1}

prefix="" ucx_prefix="" ucx_src="" nixl_src="" cuda="" subprojects="" work=""
download=${NIXL_BUILD_DOWNLOAD:-}
jobs=$(nproc)

die() { echo "build-nixl: $*" >&2; exit 2; }
# logged LOG CMD...: runs CMD with its output in LOG; on failure shows LOG's end.
logged() {
	local log=$1
	shift
	"$@" >"$log" 2>&1 || { tail -40 "$log" >&2; die "failed: $* (log: $log)"; }
}
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }

for arg in "$@"; do
	case $arg in
	--prefix=*) prefix=${arg#*=} ;;
	--ucx-prefix=*) ucx_prefix=${arg#*=} ;;
	--ucx-src=*) ucx_src=${arg#*=} ;;
	--nixl-src=*) nixl_src=${arg#*=} ;;
	--with-cuda=*) cuda=${arg#*=} ;;
	--subprojects=*) subprojects=${arg#*=} ;;
	--work-dir=*) work=${arg#*=} ;;
	--jobs=*) jobs=${arg#*=} ;;
	--download) download=1 ;;
	-h | --help) usage ;;
	*) die "unknown argument $arg (see --help)" ;;
	esac
done
[ -n "$prefix" ] || die "--prefix=DIR is required (see --help)"
ucx_prefix=${ucx_prefix:-$prefix}
abs() { mkdir -p "$1" && (cd "$1" && pwd); }
prefix=$(abs "$prefix")
ucx_prefix=$(abs "$ucx_prefix")

if [ -z "$work" ]; then
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
fi
work=$(abs "$work")

if [ -n "$download" ]; then
	if [ -z "$ucx_src" ]; then
		ucx_src=$work/ucx-$UCX_VERSION
		mkdir -p "$ucx_src"
		echo "==> downloading UCX $UCX_VERSION"
		curl -fsSL "https://github.com/openucx/ucx/releases/download/v$UCX_VERSION/ucx-$UCX_VERSION.tar.gz" |
			tar -xz --strip-components=1 -C "$ucx_src"
	fi
	if [ -z "$nixl_src" ]; then
		nixl_src=$work/nixl-$NIXL_VERSION
		echo "==> downloading NIXL $NIXL_VERSION"
		git clone --quiet --depth 1 --branch "$NIXL_VERSION" https://github.com/ai-dynamo/nixl.git "$nixl_src"
	fi
fi
if [ -z "$ucx_src" ] || [ -z "$nixl_src" ]; then
	die "give --ucx-src=DIR and --nixl-src=DIR, or --download"
fi
[ -d "$ucx_src" ] || die "--ucx-src: no directory $ucx_src"
[ -f "$nixl_src/meson.build" ] || die "--nixl-src: $nixl_src is not a NIXL source tree"
ucx_src=$(abs "$ucx_src")
nixl_src=$(abs "$nixl_src")

# UCX, built out of tree.
mkdir -p "$work/ucx-build"
if [ ! -x "$ucx_src/configure" ]; then
	echo "==> UCX: ./autogen.sh (a source tree without configure)"
	(cd "$ucx_src" && logged "$work/ucx-build/autogen.log" ./autogen.sh)
fi
ucx_cuda=(--without-cuda --without-gdrcopy)
[ -n "$cuda" ] && ucx_cuda=("--with-cuda=$cuda")
echo "==> UCX: configure and build into $ucx_prefix"
cd "$work/ucx-build"
logged configure.log "$ucx_src/contrib/configure-release" --prefix="$ucx_prefix" --enable-mt --enable-cma \
	--disable-static --disable-doxygen-doc --without-go --without-java "${ucx_cuda[@]}"
logged make.log make -j"$jobs"
logged install.log make install
cd "$work"

# NIXL. Before 0.10.0 (fixed upstream by "fix: ensure useEtcd is properly
# initialized in all cases", 5a91d107) a build without etcd leaves
# nixlAgentData::useEtcd uninitialised, and an agent whose memory held
# garbage there starts its metadata thread, which spins a core for the
# agent's life (seen with 0.7.1 on every agent created after others had
# come and gone). Initialise it as that fix does.
agent_cpp=$nixl_src/src/core/nixl_agent.cpp
if grep -q '"NIXL ETCD is excluded";' "$agent_cpp" &&
	! grep -B1 '"NIXL ETCD is excluded";' "$agent_cpp" | grep -q 'useEtcd = false;'; then
	echo "==> NIXL: initialising useEtcd in a build without etcd (the fix of NIXL 0.10.0)"
	sed -i '/"NIXL ETCD is excluded";/i\    useEtcd = false;' "$agent_cpp"
fi
if [ -n "$subprojects" ]; then
	cp -a "$subprojects"/. "$nixl_src/subprojects/"
fi
nixl_cuda=()
if [ -n "$cuda" ]; then
	nixl_cuda=("-Dcudapath_inc=$cuda/include" "-Dcudapath_lib=$cuda/lib64")
else
	# NIXL finds a CUDA toolkit in /usr/local/cuda or $CUDA_HOME on its own.
	export CUDA_HOME=/nonexistent
fi
echo "==> NIXL: meson setup and build into $prefix"
reconfigure=()
[ -d "$work/nixl-build/meson-private" ] && reconfigure=(--reconfigure)
PKG_CONFIG_PATH=$ucx_prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH} \
	logged "$work/nixl-setup.log" meson setup "${reconfigure[@]}" "$work/nixl-build" "$nixl_src" \
	--prefix="$prefix" --libdir=lib -Dbuildtype=release -Ducx_path="$ucx_prefix" \
	-Dbuild_tests=false -Dbuild_examples=false -Ddisable_gds_backend=true \
	-Ddisable_mooncake_backend=true -Drust=false "${nixl_cuda[@]}"
logged "$work/nixl-build.log" ninja -C "$work/nixl-build" -j"$jobs"
logged "$work/nixl-install.log" meson install -C "$work/nixl-build"

# NIXL's C API as a shared library: the functions its Rust bindings call.
echo "==> libnixl_capi.so"
g++ -O2 -shared -fPIC -std=c++17 "$nixl_src/src/bindings/rust/wrapper.cpp" \
	-I"$prefix/include" -I"$nixl_src/src/api/cpp" -I"$nixl_src/src/bindings/rust" \
	-L"$prefix/lib" -lnixl -lnixl_build \
	-Wl,-rpath,"$prefix/lib" -Wl,-rpath,"$ucx_prefix/lib" -o "$prefix/lib/libnixl_capi.so"

cat <<EOF
==> done. Run with:
  LD_LIBRARY_PATH=$prefix/lib:$ucx_prefix/lib
  NIXL_PLUGIN_DIR=$prefix/lib/plugins
  NIXL_CAPI_LIB=$prefix/lib/libnixl_capi.so
EOF
