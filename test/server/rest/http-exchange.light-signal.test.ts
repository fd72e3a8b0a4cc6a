// LightSignal (server/rest/http-exchange.ts), the CallSignal of a REST call's
// exchange and of an async run's stop: it behaves as an AbortSignal does for
// what skiff asks of one (the flag, the reason, "abort" listeners called once,
// in order, removable), and a subclass's hook runs with the flag already set.
import { describe, expect, it } from "vitest";
import { LightSignal, type CallSignal } from "../../../services/server/rest/http-exchange.js";

/** The same steps on a LightSignal and on a real AbortController's signal, and what each saw. */
function both(steps: (signal: CallSignal, abort: (reason?: unknown) => void, log: string[]) => void): string[][] {
  const light = new LightSignal();
  const real = new AbortController();
  const seen: string[][] = [[], []];
  steps(light, (r) => light.abort(r), seen[0]!);
  steps(real.signal, (r) => real.abort(r), seen[1]!);
  return seen;
}

describe("LightSignal", () => {
  it("aborts once: flag, reason, each listener called once with an abort event, in the order added", () => {
    const [light, real] = both((signal, abort, log) => {
      signal.addEventListener("abort", (e) => log.push(`first ${e.type} ${signal.aborted} ${String(signal.reason)}`));
      signal.addEventListener("abort", {
        handleEvent: (e: Event) => log.push(`object ${e.type}`),
      });
      log.push(`before ${signal.aborted}`);
      abort("gone");
      abort("again");
      log.push(`after ${signal.aborted} ${String(signal.reason)}`);
    });
    expect(light).toEqual(["before false", "first abort true gone", "object abort", "after true gone"]);
    expect(light).toEqual(real);
  });

  it("does not call a listener removed before the abort, nor one added after it", () => {
    const [light, real] = both((signal, abort, log) => {
      const removed = () => log.push("removed");
      signal.addEventListener("abort", removed);
      signal.addEventListener("abort", () => log.push("kept"));
      signal.removeEventListener("abort", removed);
      abort(new Error("stop"));
      signal.addEventListener("abort", () => log.push("late"));
      abort();
    });
    expect(light).toEqual(["kept"]);
    expect(light).toEqual(real);
  });

  it("calls a listener with the signal as `this`", () => {
    const signal = new LightSignal();
    let self: unknown;
    signal.addEventListener("abort", function (this: unknown) {
      self = this;
    });
    signal.abort();
    expect(self).toBe(signal);
  });

  it("runs a subclass's hook once, with the flag set, before the listeners", () => {
    const log: string[] = [];
    class Hooked extends LightSignal {
      protected override aborting(reason: unknown): void {
        log.push(`hook ${this.aborted} ${String(reason)}`);
      }
    }
    const signal = new Hooked();
    signal.addEventListener("abort", () => log.push("listener"));
    signal.abort("why");
    signal.abort("twice");
    expect(log).toEqual(["hook true why", "listener"]);
  });
});
