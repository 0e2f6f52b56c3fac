// Builds {{crate}}.wasm from store.js with componentize-js.
//
// `jco componentize` cannot read `--wit` on every toolchain (its in-process
// tools get no preopens), so this calls componentize() directly.
import { componentize } from '@bytecodealliance/componentize-js';
import { writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(here, process.argv[2] ?? '{{crate}}.wasm');

const { component } = await componentize({
  sourcePath: resolve(here, 'store.js'),
  witPath: resolve(here, 'wit'),
  worldName: 'fs-remote-client',
  // Berth links wasi:http only for plugins granted HTTP hosts; this store
  // needs none, so the engine must not import it.
  disableFeatures: ['http', 'fetch-event'],
});
await writeFile(out, component);
console.log(`{{name}}: wrote ${out} (${component.length} bytes)`);
