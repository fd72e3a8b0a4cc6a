/** The bundle of `source` (a path under the checkout), made or made again first; undefined where it cannot be written. */
export function bundleOf(source: string, name: string): Promise<string | undefined>;
/** Runs `source` from its bundle `<name>.mjs`, or through tsx as it is where no bundle can be made. */
export function runBundled(source: string, name: string): Promise<void>;
/** Makes (or makes again) the server's and the CLI's bundles; the entries it could not bundle. */
export function bundleAll(): Promise<string[]>;
