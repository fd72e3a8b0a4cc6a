// The handler's view of a REST request's headers: Node's parsed headers read
// in place, less the REST exchange's own and HTTP/2's pseudo-headers; a
// write turns it into a Headers of its own without touching Node's.
import { describe, expect, it } from "vitest";
import { requestHeaderView } from "../../../services/server/rest/request-headers.js";

const node = () => ({
  ":path": "/v4/p/a/x",
  host: "skiff.example",
  authorization: "Bearer t",
  "content-type": "application/json",
  "content-length": "12",
  connection: "keep-alive",
  "x-b": "2",
  "x-a": "1",
  "set-cookie": ["s=1", "t=2"],
});

describe("requestHeaderView", () => {
  it("reads Node's headers by any case, hiding the exchange's own", () => {
    const h = requestHeaderView(node());
    expect(h.get("Authorization")).toBe("Bearer t");
    expect(h.has("X-A")).toBe(true);
    expect(h.get("content-type")).toBeNull();
    expect(h.has("content-length")).toBe(false);
    expect(h.get("connection")).toBeNull();
    expect(h.get(":path")).toBeNull();
    expect(h.get("missing")).toBeNull();
    expect(h.getSetCookie()).toEqual(["s=1", "t=2"]);
  });

  it("iterates in the caller's order, as a Headers would give each entry", () => {
    const h = requestHeaderView(node());
    const entries = [
      ["host", "skiff.example"],
      ["authorization", "Bearer t"],
      ["x-b", "2"],
      ["x-a", "1"],
      ["set-cookie", "s=1, t=2"],
    ];
    expect([...h]).toEqual(entries);
    expect([...h.keys()]).toEqual(entries.map(([k]) => k));
    expect([...h.values()]).toEqual(entries.map(([, v]) => v));
    const seen: string[] = [];
    h.forEach((value, name) => seen.push(`${name}=${value}`));
    expect(seen).toEqual(entries.map(([k, v]) => `${k}=${v}`));
    // A Headers made from it has the same entries.
    expect(new Headers(h).get("x-b")).toBe("2");
  });

  it("a write copies the view first and leaves Node's headers alone", () => {
    const raw = node();
    const h = requestHeaderView(raw);
    h.set("x-a", "changed");
    h.append("x-new", "n");
    h.delete("x-b");
    expect(h.get("x-a")).toBe("changed");
    expect(h.get("x-new")).toBe("n");
    expect(h.has("x-b")).toBe(false);
    expect(h.get("authorization")).toBe("Bearer t");
    expect(h.get("content-type")).toBeNull();
    expect(raw["x-a"]).toBe("1");
    expect(raw["x-b"]).toBe("2");
  });
});
