#!/bin/sh
# Builds {{crate}}.wasm from store.c: wit-bindgen's C bindings for the world
# in wit/, clang for wasm32-wasi (wasi-libc), then `wasm-tools component new`
# with the preview1 reactor adapter `berth plugin new` wrote next to this.
set -eu
cd "$(dirname "$0")"
rm -rf gen
wit-bindgen c --world fs-remote-client --out-dir gen wit
clang --target=wasm32-wasi -O2 -Wall -Wextra -mexec-model=reactor -Wl,--strip-debug \
      -I gen store.c gen/fs_remote_client.c gen/fs_remote_client_component_type.o \
      -o {{crate}}.core.wasm
wasm-tools component new {{crate}}.core.wasm \
      --adapt wasi_snapshot_preview1=wasi_snapshot_preview1.reactor.wasm \
      -o {{crate}}.wasm
echo "{{name}}: wrote {{crate}}.wasm"
