/* Back-of-envelope calculators (docs/calculators/): the formulas of
 * reference_impl/calculators.py and reference_impl/comm/cost_model.py, in the browser.
 *
 * The constants (interconnect profiles with alpha and beta, algorithm names, optimiser
 * state sizes) are not written here: the build hook docs/hooks/calculators.py puts them in
 * the page as JSON (<script id="calculator-constants">), from the Python objects.
 * Every <form data-calculator="..."> is recomputed on each input (an input with step="1" must
 * hold a whole number; a bad input is named in every output); each result is written
 * to an <output name="..."> as text and, unrounded, in its data-value attribute, which the
 * browser test compares with the Python functions. Names of code (recursive_doubling) are
 * shown as words (k.labels). The page's Python snippet (the first code block with the class
 * calculator-python after the form) is rewritten with the inputs, so that running it prints
 * the results the form shows.
 */
(function () {
  "use strict";

  function pow2Below(p) { return Math.pow(2, Math.floor(Math.log2(p))); }

  function fold(n, p, c) {
    return p === pow2Below(p) ? 0 : 2 * (c.alpha + n * c.beta) + n * c.gamma;
  }

  // The closed forms of reference_impl/comm/cost_model.py, term for term.
  var ALLREDUCE = {
    ring: function (n, p, c) {
      if (p === 1) return 0;
      return 2 * (p - 1) * c.alpha + 2 * (p - 1) / p * n * c.beta + (p - 1) / p * n * c.gamma;
    },
    recursive_doubling: function (n, p, c) {
      if (p === 1) return 0;
      var k = Math.log2(pow2Below(p));
      return k * (c.alpha + n * c.beta + n * c.gamma) + fold(n, p, c);
    },
    rabenseifner: function (n, p, c) {
      if (p === 1) return 0;
      var p2 = pow2Below(p), k = Math.log2(p2);
      return 2 * k * c.alpha + 2 * (p2 - 1) / p2 * n * c.beta + (p2 - 1) / p2 * n * c.gamma + fold(n, p, c);
    },
    tree: function (n, p, c) {
      if (p === 1) return 0;
      var k = Math.ceil(Math.log2(p));
      return k * (c.alpha + n * c.beta + n * c.gamma) + k * (c.alpha + n * c.beta);
    }
  };

  function psSeconds(n, workers, servers, c) {
    return 2 * Math.max(workers, servers) * c.alpha + 2 * Math.max(workers / servers, 1) * n * c.beta
      + workers / servers * n * c.gamma;
  }

  function seconds(s) {
    if (s < 1e-3) return (s * 1e6).toPrecision(3) + " µs";
    if (s < 1) return (s * 1e3).toPrecision(3) + " ms";
    return s.toPrecision(3) + " s";
  }
  function bytes(b) {
    var units = ["B", "kB", "MB", "GB", "TB"], i = 0;
    while (b >= 1000 && i < units.length - 1) { b /= 1000; i++; }
    return (i === 0 ? b.toFixed(0) : b.toPrecision(3)) + " " + units[i];
  }
  function percent(f) { return (100 * f).toPrecision(3) + " %"; }

  var CALCULATORS = {
    "allreduce-time": function (v, k) {
      var link = k.interconnects[v.interconnect], n = v.megabytes * 1e6, p = Math.round(v.ranks);
      var best = null, out = {};
      k.algorithms.forEach(function (a) {  // ties go to the earlier algorithm, as in best_allreduce
        if (!ALLREDUCE[a]) throw new Error("calculators.js has no formula for the allreduce algorithm " + a
          + " of reference_impl/comm/cost_model.py: add it to ALLREDUCE");
        var t = ALLREDUCE[a](n, p, link);
        out["time_" + a] = [t, seconds];
        if (best === null || t < best.t) best = { a: a, t: t };
      });
      out.seconds = [ALLREDUCE[v.algorithm](n, p, link), seconds];
      out.best = [best.a, function (a) { return label(k, a) + " (" + seconds(best.t) + ")"; }];
      return out;
    },
    "ps-vs-allreduce": function (v, k) {
      var link = k.interconnects[v.interconnect], n = v.megabytes * 1e6;
      var w = Math.round(v.workers), s = Math.round(v.servers), ringEach = 2 * (w - 1) / w * n;
      return {
        ring_seconds: [ALLREDUCE.ring(n, w, link), seconds],
        ps_seconds: [psSeconds(n, w, s, link), seconds],
        ring_bytes_per_worker: [ringEach, bytes],
        ps_bytes_per_worker: [n, bytes],
        ps_bytes_per_server: [w * n / s, bytes],
        ring_bytes_total: [ringEach * w, bytes],
        ps_bytes_total: [2 * w * n, bytes]
      };
    },
    "pipeline-bubble": function (v) {
      var p = Math.round(v.stages), m = Math.round(v.microbatches);
      return { fraction: [(p - 1) / (m + p - 1), percent] };
    },
    "training-memory": function (v, k) {
      var n = v.parameters_millions * 1e6, mixed = v.precision === "mixed", b = mixed ? 2 : 4;
      var parts = {
        weights: b * n,
        gradients: b * n,
        master_weights: mixed ? 4 * n : 0,
        optimizer_state: 4 * k.optimizer_slots[v.optimizer] * n,
        activations: b * v.activations_millions * 1e6
      };
      var out = {}, total = 0;
      Object.keys(parts).forEach(function (name) { out[name] = [parts[name], bytes]; total += parts[name]; });
      out.total = [total, bytes];
      return out;
    },
    // reference_impl.calculators.sharded_memory: memory_breakdown's model states per parameter
    // and activation_elements of reference_impl/parallel/memory.py, comm_elements of zero.py.
    "sharded-memory": function (v, k) {
      var psi = v.parameters_billions * 1e9, L = v.layers, C = v.hidden, H = v.heads, T = v.seq, B = v.batch;
      var V = v.vocab, n = v.ranks, stage = Number(v.stage), recompute = v.recompute === "yes";
      var bytesPer = k.sharded_precisions[v.precision];  // compute copy, gradient, float32 master copy
      var K = bytesPer[2] + 4 * k.sharded_optimizer_slots[v.optimizer];  // the ZeRO paper's K
      var N = B * T;
      var block = recompute ? N * C : 16 * N * C + 2 * N + B * H * T * T;  // block_cache_elements
      var head = N * (2 * C + 1 + V);                                     // head_cache_elements
      var arch = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;       // transformer.n_params
      var parts = {
        parameters: bytesPer[0] * psi / (stage >= 3 ? n : 1),
        gradients: bytesPer[1] * psi / (stage >= 2 ? n : 1),
        optimizer_state: K * psi / (stage >= 1 ? n : 1),
        activations: bytesPer[0] * (L * block + head)
      };
      var out = {}, total = 0;
      Object.keys(parts).forEach(function (name) { out[name] = [parts[name], bytes]; total += parts[name]; });
      out.total = [total, bytes];
      out.comm_bytes_per_step = [bytesPer[1] * (stage === 3 ? 3 : 2) * (n - 1) / n * psi, bytes];
      out.architecture_parameters = [arch, function (x) { return (x / 1e9).toPrecision(3) + " billion"; }];
      return out;
    }
  };

  function label(k, name) { return (k.labels && k.labels[name]) || String(name).replace(/_/g, " "); }

  // Python literals for the snippets: numbers as JavaScript prints them (the same doubles in
  // Python), names as strings.
  function py(x) { return typeof x === "number" ? String(x) : JSON.stringify(String(x)); }
  // The network argument: a profile name, or the link fitted on the benchmark machine.
  function network(name, k) {
    if (k.measured_profile && name === k.measured_profile) {
      return { imports: ", measured_link", before: "link = measured_link(\"docs/assets/bench/alpha_beta.json\")"
        + "  # the profile measured on this machine; run from the repository root\n", arg: "link" };
    }
    return { imports: "", before: "", arg: py(name) };
  }

  // The Python that gives each calculator's results: reference_impl/calculators.py, called
  // with the form's inputs (run from the repository root).
  var PYTHON = {
    "allreduce-time": function (v, k) {
      var net = network(v.interconnect, k);
      return "from reference_impl.calculators import allreduce_seconds" + net.imports + "\n\n"
        + "megabytes, ranks = " + py(v.megabytes) + ", " + py(v.ranks) + "\n" + net.before
        + "seconds = allreduce_seconds(megabytes * 1e6, ranks, network=" + net.arg
        + ", algorithm=" + py(v.algorithm) + ")\n"
        + "print(seconds)\n";
    },
    "ps-vs-allreduce": function (v, k) {
      var net = network(v.interconnect, k);
      return "from reference_impl.calculators import ps_vs_allreduce" + net.imports + "\n\n"
        + "megabytes = " + py(v.megabytes) + "\n" + net.before
        + "t = ps_vs_allreduce(megabytes * 1e6, workers=" + py(v.workers) + ", servers=" + py(v.servers)
        + ", network=" + net.arg + ")\n"
        + "print(t)\n";
    },
    "pipeline-bubble": function (v) {
      return "from reference_impl.calculators import pipeline_bubble_fraction\n\n"
        + "fraction = pipeline_bubble_fraction(stages=" + py(v.stages) + ", microbatches=" + py(v.microbatches) + ")\n"
        + "print(fraction)\n";
    },
    "training-memory": function (v) {
      return "from reference_impl.calculators import training_memory\n\n"
        + "m = training_memory(" + py(v.parameters_millions) + " * 1e6, precision=" + py(v.precision)
        + ", optimizer=" + py(v.optimizer) + ",\n"
        + "                    activation_values=" + py(v.activations_millions) + " * 1e6)\n"
        + "print(m)\nprint(m.total)\n";
    },
    "sharded-memory": function (v) {
      return "from reference_impl.calculators import sharded_memory\n\n"
        + "m = sharded_memory(" + py(v.parameters_billions) + " * 1e9, layers=" + py(v.layers) + ", hidden="
        + py(v.hidden) + ", heads=" + py(v.heads) + ", seq=" + py(v.seq) + ",\n"
        + "                   batch=" + py(v.batch) + ", vocab=" + py(v.vocab) + ", precision=" + py(v.precision)
        + ", optimizer=" + py(v.optimizer) + ",\n"
        + "                   stage=" + Number(v.stage) + ", ranks=" + py(v.ranks) + ", recompute="
        + (v.recompute === "yes" ? "True" : "False") + ")\n"
        + "print(m)\nprint(m.total)\n";
    }
  };

  // The first code block of class calculator-python that follows the form in the page.
  function snippetAfter(form) {
    var blocks = document.querySelectorAll(".calculator-python");
    for (var i = 0; i < blocks.length; i++) {
      if (form.compareDocumentPosition(blocks[i]) & Node.DOCUMENT_POSITION_FOLLOWING) {
        return blocks[i].querySelector("code") || blocks[i];
      }
    }
    return null;
  }

  // Checks beyond "a number, at least min, whole where the input asks for a whole number".
  var CHECKS = {
    "sharded-memory": function (v) {
      if (v.hidden % v.heads !== 0) return "the hidden size must be a multiple of the number of heads";
      return null;
    }
  };

  function fillSelect(select, names, k) {
    if (select.options.length) return;
    names.forEach(function (name) {
      var o = document.createElement("option");
      o.value = name;
      o.textContent = label(k, name);
      select.appendChild(o);
    });
    if (select.dataset.default) select.value = select.dataset.default;
  }

  function init() {
    var node = document.getElementById("calculator-constants");
    if (!node) return;
    var k = JSON.parse(node.textContent);
    document.querySelectorAll("form[data-calculator]").forEach(function (form) {
      var compute = CALCULATORS[form.dataset.calculator];
      form.querySelectorAll("select[data-options]").forEach(function (sel) {
        var source = k[sel.dataset.options];  // a list of names, or a table keyed by name
        fillSelect(sel, Array.isArray(source) ? source : Object.keys(source), k);
      });
      var snippet = snippetAfter(form), python = PYTHON[form.dataset.calculator];
      function update() {
        var values = {}, problem = null;
        form.querySelectorAll("input, select").forEach(function (el) {
          if (el.tagName === "SELECT") { values[el.name] = el.value; return; }
          var x = Number(el.value), min = Number(el.min || 0), whole = el.step === "1";
          var label = el.dataset.label || el.name;
          if (problem === null && (el.value === "" || !isFinite(x) || x < min || (whole && !Number.isInteger(x)))) {
            problem = label + " must be " + (whole ? "a whole number" : "a number") + " of at least " + min;
          }
          values[el.name] = x;
        });
        if (problem === null && CHECKS[form.dataset.calculator]) problem = CHECKS[form.dataset.calculator](values);
        form.querySelectorAll("output").forEach(function (out) {
          if (problem !== null) { out.textContent = "enter valid numbers: " + problem; out.dataset.value = ""; }
        });
        if (problem !== null) {
          if (snippet && python) snippet.textContent = "# enter valid numbers: " + problem + "\n";
          return;
        }
        if (snippet && python) snippet.textContent = python(values, k);
        var results = compute(values, k);
        Object.keys(results).forEach(function (name) {
          var out = form.querySelector('output[name="' + name + '"]');
          if (!out) return;
          out.dataset.value = String(results[name][0]);
          out.textContent = results[name][1](results[name][0]);
        });
      }
      form.addEventListener("input", update);
      form.addEventListener("change", update);
      form.addEventListener("submit", function (e) { e.preventDefault(); });
      update();
    });
  }

  // For the pages with a calculator script of their own (parallel-layout.js).
  window.LabCalculators = { snippetAfter: snippetAfter };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
