/* Scrollable regions that a keyboard can reach (WCAG 2.1.1).
 *
 * A wide formula (div.arithmatex) or a wide table (Material wraps each in
 * .md-typeset__scrollwrap) scrolls sideways on a narrow screen; without focus a keyboard user
 * cannot scroll it. Each one that overflows gets tabindex="0", as Material itself does for
 * code blocks; one that fits does not, so it adds no tab stop. Checked again on every resize. */
(function () {
  "use strict";
  var SELECTOR = ".md-typeset div.arithmatex, .md-typeset .md-typeset__scrollwrap";

  function update() {
    document.querySelectorAll(SELECTOR).forEach(function (el) {
      if (el.scrollWidth > el.clientWidth || el.scrollHeight > el.clientHeight) {
        if (!el.hasAttribute("tabindex")) {
          el.setAttribute("tabindex", "0");
          el.dataset.scrollFocus = "";
        }
      } else if (el.dataset.scrollFocus !== undefined) {
        el.removeAttribute("tabindex");
        delete el.dataset.scrollFocus;
      }
    });
  }

  var pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; update(); });
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(update);  // Material's page-ready signal (tables are wrapped by then)
  } else {
    document.addEventListener("DOMContentLoaded", update);
  }
  window.addEventListener("load", update);
  window.addEventListener("resize", schedule);
  // Formulas take their final width once their fonts are in, which may be after "load".
  if (document.fonts && document.fonts.ready) document.fonts.ready.then(update);
})();
