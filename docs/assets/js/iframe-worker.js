/* Search on a copy of the site opened from disk (make site-offline, file:// URLs).

   The theme searches its index in a Web Worker, and browsers refuse to start a worker from
   a file:// URL. On file:// only, this script replaces `Worker` with `FileWorker`, which runs
   the worker's script in a hidden iframe of the page instead: scripts load there from disk,
   and the page and the script exchange messages through the iframe's window, as they would
   through a worker. Over http(s) it does nothing. (Material's offline plugin loads a shim of
   the same idea, iframe-worker, from a CDN; the offline site must not need the network.)

   What a worker's script may use here: `postMessage(data)`, `onmessage` or
   `addEventListener("message", ...)`; what the page may use: `postMessage`, `onmessage`,
   `addEventListener("message" | "error", ...)` and `terminate()`. Data is copied with
   structuredClone, as a worker's would be. `importScripts` is not offered (a page cannot load
   a script synchronously into an iframe): a script that calls it raises a clear error. The name is the one the offline plugin looks
   for, so that it adds no CDN copy of its own. */
(function () {
  "use strict";
  if (location.protocol !== "file:" || typeof EventTarget !== "function") return;

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this.pending = [];  // messages posted before the script has loaded
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      this.frame.tabIndex = -1;
      this.frame.title = "search";
      this.frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).append(this.frame);

      const scope = this.frame.contentWindow;  // the script's global scope
      scope.postMessage = (data) => this.deliver("message", structuredClone(data));
      scope.importScripts = () => {
        throw new Error("importScripts is not available to a worker run from file:// (iframe-worker.js)");
      };
      scope.addEventListener("error", (event) => this.deliver("error", event.message));
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        const queued = this.pending;
        this.pending = null;
        queued.forEach((data) => this.postMessage(data));
      };
      script.onerror = () => this.deliver("error", `could not load the worker script ${script.src}`);
      scope.document.head.append(script);
    }

    postMessage(data) {
      if (this.pending) {
        this.pending.push(data);
        return;
      }
      const scope = this.frame.contentWindow;
      const copy = structuredClone(data);
      setTimeout(() => scope.dispatchEvent(new scope.MessageEvent("message", { data: copy })));
    }

    deliver(type, payload) {
      setTimeout(() => {
        const event = type === "message"
          ? new MessageEvent("message", { data: payload })
          : new ErrorEvent("error", { message: String(payload) });
        const handler = type === "message" ? this.onmessage : this.onerror;
        if (typeof handler === "function") handler.call(this, event);
        this.dispatchEvent(event);
      });
    }

    terminate() {
      this.frame.remove();
      this.pending = null;
    }
  }

  window.Worker = FileWorker;
})();
