// A REST call's request headers as its handler's context gives them: a view
// of the headers Node parsed, with no copy, less those of the REST exchange
// itself (isRestExchangeHeader) and HTTP/2's pseudo-headers. It does what a
// Headers (the type Connect's HandlerContext holds) does; its reads go to
// Node's object, and a write first copies the view into a Headers of its
// own, which holds them from then on. Names come in the order the caller
// sent them, not sorted.
import type http from "node:http";
import { isRestExchangeHeader } from "../headers.js";

function joined(value: string | string[]): string {
  return Array.isArray(value) ? value.join(", ") : value;
}

function hidden(name: string): boolean {
  return name.startsWith(":") || isRestExchangeHeader(name);
}

class RequestHeaderView {
  /** The headers once written to; until then, Node's are read. */
  #own: Headers | undefined;

  constructor(private readonly view: http.IncomingHttpHeaders) {}

  /** The Headers that holds them, made before a write. */
  #owned(): Headers {
    if (this.#own) return this.#own;
    const own = new Headers();
    for (const [name, value] of this.entries()) own.append(name, value);
    return (this.#own = own);
  }

  get(name: string): string | null {
    if (this.#own) return this.#own.get(name);
    const lower = name.toLowerCase();
    const value = this.view[lower];
    return value === undefined || hidden(lower) ? null : joined(value);
  }

  has(name: string): boolean {
    return this.get(name) !== null;
  }

  getSetCookie(): string[] {
    if (this.#own) return this.#own.getSetCookie();
    return [...(this.view["set-cookie"] ?? [])];
  }

  set(name: string, value: string): void {
    this.#owned().set(name, value);
  }

  append(name: string, value: string): void {
    this.#owned().append(name, value);
  }

  delete(name: string): void {
    this.#owned().delete(name);
  }

  *entries(): IterableIterator<[string, string]> {
    if (this.#own) return yield* this.#own.entries();
    const view = this.view;
    for (const name in view) {
      const value = view[name];
      if (value !== undefined && !hidden(name)) yield [name, joined(value)];
    }
  }

  *keys(): IterableIterator<string> {
    for (const [name] of this.entries()) yield name;
  }

  *values(): IterableIterator<string> {
    for (const [, value] of this.entries()) yield value;
  }

  [Symbol.iterator](): IterableIterator<[string, string]> {
    return this.entries();
  }

  forEach(callback: (value: string, name: string, parent: Headers) => void, thisArg?: unknown): void {
    for (const [name, value] of this.entries()) callback.call(thisArg, value, name, this as unknown as Headers);
  }

  get [Symbol.toStringTag](): string {
    return "Headers";
  }
}

/** The handler's view of a REST request's headers (see above). */
export function requestHeaderView(headers: http.IncomingHttpHeaders): Headers {
  return new RequestHeaderView(headers) as unknown as Headers;
}
