/// <reference types="vitest/config" />
import { defineConfig } from 'vite';
import preact from '@preact/preset-vite';

// The build is embedded in the relay binary (rust-embed) and used as Tauri's frontendDist,
// so paths are relative and the output must be byte-for-byte reproducible.
export default defineConfig({
  base: './',
  plugins: [preact({ prerender: { enabled: false } })],
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2020',
    sourcemap: false,
    reportCompressedSize: true,
    chunkSizeWarningLimit: 200,
  },
  server: {
    // `npm run dev` talks to a relay on MODELRELAY_URL (default http://127.0.0.1:8080).
    proxy: {
      '/api': process.env.MODELRELAY_URL ?? 'http://127.0.0.1:8080',
    },
  },
  test: {
    include: ['src/**/*.test.ts'],
    environment: 'node',
  },
});
