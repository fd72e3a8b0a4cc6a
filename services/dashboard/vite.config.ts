// Builds the dashboard into dist/ (git-ignored), which the management role
// serves at `/`. Everything is bundled: the page loads nothing from elsewhere.
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  plugins: [react()],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    // Served with a strict Content-Security-Policy: no inline scripts, no data: modules.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    sourcemap: false,
  },
  logLevel: "warn",
});
