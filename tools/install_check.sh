#!/usr/bin/env bash
# Installs a build into a fresh prefix and uses it the way a user would, from outside the source
# tree: the installed files (headers, libcoda.so.MAJOR with its SONAME, no RUNPATH to the CUDA
# toolkit, the CMake package and coda.pc), a C and a C++ consumer found with find_package(coda)
# (tests/install), the C consumer built with pkg-config alone, and the examples (examples/) built
# against the installed tree.
#   tools/install_check.sh [BUILD]      default: $BUILD_DIR or build
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${BUILD_DIR:-build}}
jobs=${JOBS:-$(nproc)}
work=$(mktemp -d /tmp/coda-install-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
say() { echo "install_check: $*"; }
die() { echo "install_check: FAILED: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
version=$(sed -n 's/^#define CODA_VERSION_STRING "\(.*\)"/\1/p' include/coda/coda.h)
major=${version%%.*}
libdir=$(dirname "$(find "$prefix" -name "libcoda.so.$version" | head -n 1)")
[[ -n $libdir && -d $libdir ]] || die "no libcoda.so.$version under $prefix"
for f in include/coda/coda.h include/coda/coda.hpp include/coda/block/llama.h \
         include/coda/reference/gemm.hpp; do
  [[ -f $prefix/$f ]] || die "$f not installed"
done
[[ -L $libdir/libcoda.so && -L $libdir/libcoda.so.$major ]] || die "libcoda.so symlinks missing"
soname=$(readelf -d "$libdir/libcoda.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == "libcoda.so.$major" ]] || die "SONAME is '$soname', expected libcoda.so.$major"
if readelf -d "$libdir/libcoda.so.$version" | grep -E '\((RUNPATH|RPATH)\)'; then
  die "the installed libcoda carries a RUNPATH"
fi
[[ -f $libdir/cmake/coda/codaConfig.cmake && -f $libdir/pkgconfig/coda.pc ]] \
  || die "no CMake package or pkg-config file"
say "installed $(find "$prefix" -type f | wc -l) files: SONAME $soname, no RUNPATH"

# Sources copied out of the tree, so that nothing resolves against the repository.
cp -r tests/install "$work/consumers"
cp -r examples "$work/examples"
rm -f "$work/examples/"*.py

cmake -S "$work/consumers" -B "$work/consumers-build" -DCMAKE_PREFIX_PATH="$prefix" \
  > "$work/consumers.log" || { cat "$work/consumers.log"; die "configure tests/install"; }
cmake --build "$work/consumers-build" -j "$jobs" >> "$work/consumers.log" \
  || { cat "$work/consumers.log"; die "build tests/install"; }
ctest --test-dir "$work/consumers-build" --output-on-failure || die "tests/install consumers"

export PKG_CONFIG_PATH=$libdir/pkgconfig
cc -std=c99 -o "$work/pc_consumer" tests/install/consumer.c $(pkg-config --cflags --libs coda) -lm \
  || die "the C consumer with pkg-config"
LD_LIBRARY_PATH=$libdir "$work/pc_consumer" || die "the pkg-config consumer"
say "pkg-config $(pkg-config --modversion coda): ok"

cmake -S "$work/examples" -B "$work/examples-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/examples.log" \
  || { cat "$work/examples.log"; die "configure the examples"; }
cmake --build "$work/examples-build" -j "$jobs" >> "$work/examples.log" \
  || { cat "$work/examples.log"; die "build the examples against the installed tree"; }
ctest --test-dir "$work/examples-build" --output-on-failure || die "the examples"
say "ok: consumers (find_package, pkg-config) and examples build and run against $prefix"
