#!/usr/bin/env node
// The `skiff` command: runs the TypeScript CLI straight from the checkout.
import { register } from "tsx/esm/api";

register({ tsconfig: new URL("../tsconfig.json", import.meta.url).pathname });
await import("../services/cli/main.ts");
