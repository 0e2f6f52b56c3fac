// Builds js-store into ../target/js_store.wasm with componentize-js.
//
// `jco componentize` cannot read `--wit` on this toolchain (its in-process
// tools get no preopens), so this calls componentize() directly.
import { componentize } from '@bytecodealliance/componentize-js';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(here, process.argv[2] ?? '../target/js_store.wasm');

const { component } = await componentize({
  sourcePath: resolve(here, 'store.js'),
  witPath: resolve(here, '../wit-fs'),
  worldName: 'fs-remote-client',
  // Berth links wasi:http only for plugins granted HTTP hosts; this store
  // needs none, so the engine must not import it.
  disableFeatures: ['http', 'fetch-event'],
});
await mkdir(dirname(out), { recursive: true });
await writeFile(out, component);
console.log(`js-store: wrote ${out} (${component.length} bytes)`);
