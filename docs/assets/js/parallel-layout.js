/* The parallel layout planner (docs/calculators/parallel-layout.md): reference_impl/parallel/planner.py
 * in the browser, formula for formula and in the same order of operations, so that the browser
 * test (tests/test_layout_calculator.py) can hold every number to the Python one at 1e-12.
 *
 * The cluster presets (GPUs per node, memory, peak FLOP/s, efficiency, NVLink and network α, β, γ)
 * and the lists the enumeration walks (micro-batch sizes, ZeRO stages, recomputation) are not
 * written here: the build hook docs/hooks/calculators.py puts planner.browser_constants() into the
 * page as JSON (<script id="calculator-constants">, key "parallel_layout").
 */
(function () {
  "use strict";

  // reference_impl/comm/cost_model.py
  function ringAllreduce(n, p, c) {
    if (p === 1) return 0;
    return 2 * (p - 1) * c.alpha + 2 * (p - 1) / p * n * c.beta + (p - 1) / p * n * c.gamma;
  }
  function ringReduceScatter(n, p, c) { return (p - 1) * (c.alpha + n / p * (c.beta + c.gamma)); }
  function ringAllgather(n, p, c) { return (p - 1) * (c.alpha + n / p * c.beta); }
  function pairwiseAlltoall(n, p, c) { return p > 1 ? (p - 1) * (c.alpha + n / p * c.beta) : 0; }

  function divisors(n) {
    var out = [];
    for (var k = 1; k <= n; k++) if (n % k === 0) out.push(k);
    return out;
  }

  // ---------------------------------------------------------------- the model (planner.Model)
  function model(v) {
    var h = v.hidden, moe = v.experts > 1;
    var m = { layers: v.layers, hidden: h, heads: v.heads, seq: v.seq, vocab: v.vocab, experts: v.experts,
              topK: v.top_k, moe: moe, vb: 2 };
    m.attention = 4 * h * h + 4 * h;
    m.expert = 8 * h * h + 5 * h;
    m.replicated = 4 * h + (moe ? h * v.experts : 0);
    m.block = m.attention + v.experts * m.expert + m.replicated;
    m.parameters = v.layers * m.block + (v.vocab + v.seq) * h + 2 * h;
    m.active = m.parameters - v.layers * (v.experts - v.top_k) * m.expert;
    return m;
  }

  function stepFlops(m, B, recompute) {
    var h = m.hidden, s = m.seq;
    var linear = 8 * h * h + 16 * m.topK * h * h, core = 4 * s * h, layer = linear + core;
    var extra = { none: 0, selective: core, full: layer }[recompute];
    var perToken = m.layers * (3 * layer + extra) + 6 * h * m.vocab;
    return B * s * perToken;
  }

  function groupLink(c, stride, size) {
    var g = c.gpus_per_node;
    if (size <= 1 || (stride * size <= g && g % (stride * size) === 0)) return { link: c.intra, where: "NVLink" };
    var members = stride < g ? Math.max(1, Math.min(size, Math.floor(g / stride))) : 1;
    var beta = Math.max(c.inter.beta / members, c.intra.beta);
    return { link: { alpha: c.inter.alpha, beta: beta, gamma: c.inter.gamma }, where: "network x" + members };
  }

  // ---------------------------------------------------------------- memory (planner.memory_per_gpu)
  function activationPerLayer(m, b, tp, sp, recompute) {
    var s = m.seq, h = m.hidden, sbh = s * b * h;
    var rep = 7 + 3 * m.topK, par = 8 + 16 * m.topK, scores = 5 * m.heads * s / h, scale = m.vb / 2;
    if (recompute === "full") return scale * 2 * sbh / (sp ? tp : 1);
    var keep = recompute === "selective" ? 0 : scores;
    if (sp) return scale * sbh * (rep + par + keep) / tp;
    return scale * sbh * (rep + (par + keep) / tp);
  }

  function stageParameters(m, L) {
    var t = L.tp, h = m.hidden;
    var perLayer = (m.attention + (m.moe ? 0 : m.expert)) / t + m.replicated;
    var expertLayer = m.moe ? (m.experts / L.ep) * m.expert / t : 0;
    var layers = m.layers / L.pp;
    var dense = layers * perLayer + m.vocab * h / t + m.seq * h + (L.pp === 1 ? 2 * h : 0);
    return [dense, layers * expertLayer, perLayer + expertLayer];
  }

  function modelStates(psi, ranks, stage, k) {
    return [k.value_bytes * psi / (stage >= 3 ? ranks : 1), k.grad_bytes * psi / (stage >= 2 ? ranks : 1),
            k.optimizer_k * psi / (stage >= 1 ? ranks : 1)];
  }

  function memory(m, L, B, k) {
    var d = L.dp, t = L.tp, p = L.pp, b = L.mb, mb = Math.floor(B / (d * b));
    var sp3 = stageParameters(m, L);
    var parts = [modelStates(sp3[0], d, L.zero, k)];
    if (m.moe) parts.push(modelStates(sp3[1], Math.floor(d / L.ep), L.zero, k));
    var sums = [0, 1, 2].map(function (i) { return parts.reduce(function (a, x) { return a + x[i]; }, 0); });
    var vb = m.vb;
    var buffers = (L.zero >= 2 ? vb * sp3[2] : 0) + (L.zero >= 3 ? vb * sp3[2] : 0);
    var inFlight = p > 1 ? Math.min(p, mb) : 1;
    var stored = activationPerLayer(m, b, t, L.sp, L.rc);
    var acts = inFlight * (m.layers / p) * stored;
    if (L.rc === "full") acts += activationPerLayer(m, b, t, L.sp, "none");
    var s = m.seq, h = m.hidden, split = L.sp ? t : 1;
    var embedding = (8 * s * b + s * b * h) * inFlight / split;
    var output = 0;
    if (p === 1) output = L.sp ? 4 * s * b * h * (1 + m.vocab / h) / t : 2 * (s * b * m.vocab / t + s * b * h);
    acts += (embedding + output) * vb / 2;
    var total = sums[0] + sums[1] + sums[2] + buffers + acts;
    return { parameters: sums[0], gradients: sums[1], optimizer_state: sums[2], zero_buffers: buffers,
             activations: acts, total: total };
  }

  // ---------------------------------------------------------------- time (planner.step_time)
  function stepTime(m, L, c, B) {
    var t = L.tp, p = L.pp, d = L.dp, b = L.mb, e = L.ep, mb = Math.floor(B / (d * b));
    var s = m.seq, h = m.hidden, vb = m.vb, layers = Math.floor(m.layers / p), full = L.rc === "full";
    var gpus = t * p * d;
    var compute = stepFlops(m, B, L.rc) / gpus / (c.peak_flops * c.efficiency);
    var activation = s * b * h * vb;
    var tp = t > 1 ? mb * layers * (full ? 6 : 4) * ringAllreduce(activation, t, groupLink(c, 1, t).link) : 0;
    var ep = 0;
    if (m.moe && e > 1) {
      var sent = s * b * m.topK * h * vb / (L.sp ? t : 1);
      ep = mb * layers * (full ? 6 : 4) * pairwiseAlltoall(sent, e, groupLink(c, t, e).link);
    }
    var p2p = 0;
    if (p > 1) {
      var ppl = groupLink(c, t * d, p).link;
      p2p = mb * 2 * (ppl.alpha + activation / t * ppl.beta);
    }
    var sp3 = stageParameters(m, L);
    var groups = [[sp3[0] * vb, d, groupLink(c, t, d).link]];
    if (m.moe) groups.push([sp3[1] * vb, Math.floor(d / e), groupLink(c, t * e, Math.floor(d / e)).link]);
    var perMicro = 0, perStep = 0;
    groups.forEach(function (g) {
      var n = g[0], ranks = g[1], link = g[2];
      if (ranks <= 1) return;
      var rs = ringReduceScatter(n, ranks, link), ag = ringAllgather(n, ranks, link);
      if (L.zero <= 1) perStep += ringAllreduce(n, ranks, link);
      else if (L.zero === 2) { perMicro += mb * rs; perStep += ag; }
      else perMicro += mb * (2 * ag + rs);
    });
    var work = compute + tp + ep + p2p + perMicro;
    var bubble = (p - 1) / mb * work;
    return { compute: compute, tp: tp, ep: ep, p2p: p2p, zero_per_microbatch: perMicro, bubble: bubble,
             dp: perStep, total: work + bubble + perStep };
  }

  // ---------------------------------------------------------------- validity (planner.check)
  function check(L, m, c, B) {
    var gpus = L.tp * L.pp * L.dp;
    if (gpus !== c.gpus) return ["gpus", "dp x tp x pp = " + gpus + ", not the cluster's " + c.gpus + " GPUs"];
    if (m.heads % L.tp) return ["tp_heads", "tp=" + L.tp + " does not divide the " + m.heads + " attention heads"];
    if (m.layers % L.pp) return ["pp_layers", "pp=" + L.pp + " does not divide the " + m.layers + " layers"];
    if (m.experts % L.ep) return ["ep_experts", "ep=" + L.ep + " does not divide the " + m.experts + " experts"];
    if (L.dp % L.ep) return ["ep_dp", "ep=" + L.ep + " does not divide dp=" + L.dp
      + " (expert-parallel groups are made of data-parallel ranks)"];
    if (B % (L.dp * L.mb)) return ["batch", "global batch " + B + " is not divisible by dp x micro-batch = "
      + L.dp + " x " + L.mb];
    if (L.zero >= 2 && L.pp > 1) return ["zero_pp", "ZeRO-" + L.zero + " shards the gradients that pipeline "
      + "parallelism accumulates over micro-batches (DeepSpeed refuses ZeRO-2/3 with pp > 1)"];
    return null;
  }

  var RC = ["none", "selective", "full"];
  function sortKey(a, b) {
    var ka = [a.time.total, a.memory.total, a.L.tp, a.L.pp, a.L.ep, a.L.zero, RC.indexOf(a.L.rc), a.L.sp ? 1 : 0, a.L.mb];
    var kb = [b.time.total, b.memory.total, b.L.tp, b.L.pp, b.L.ep, b.L.zero, RC.indexOf(b.L.rc), b.L.sp ? 1 : 0, b.L.mb];
    for (var i = 0; i < ka.length; i++) if (ka[i] !== kb[i]) return ka[i] < kb[i] ? -1 : 1;
    return 0;
  }

  // planner.plan: every layout, ranked or dropped
  function plan(m, c, B, k) {
    var ranked = [], invalid = [], tooBig = [], n = c.gpus;
    divisors(n).forEach(function (t) {
      divisors(n / t).forEach(function (p) {
        var d = n / (t * p);
        divisors(m.experts).forEach(function (e) {
          k.micro_batches.forEach(function (b) {
            k.zero_stages.forEach(function (z) {
              if (z > 0 && d === 1) return;
              [false, true].forEach(function (sp) {
                if (sp && t === 1) return;
                k.recompute.forEach(function (rc) {
                  var L = { tp: t, pp: p, dp: d, ep: e, zero: z, mb: b, sp: sp, rc: rc };
                  var bad = check(L, m, c, B);
                  if (bad) { invalid.push({ L: L, kind: bad[0], reason: bad[1] }); return; }
                  var est = { L: L, memory: memory(m, L, B, k), time: stepTime(m, L, c, B) };
                  if (est.memory.total > c.memory_bytes * c.usable_fraction) {
                    est.kind = "memory";
                    tooBig.push(est);
                  } else ranked.push(est);
                });
              });
            });
          });
        });
      });
    });
    ranked.sort(sortKey);
    tooBig.sort(sortKey);
    return { ranked: ranked, invalid: invalid, tooBig: tooBig };
  }

  // ---------------------------------------------------------------- the page
  function gb(x) { return (x / 1e9).toFixed(1) + " GB"; }
  function secs(x) { return x < 1 ? (x * 1e3).toPrecision(3) + " ms" : x.toPrecision(3) + " s"; }
  function label(L) {
    return "tp=" + L.tp + " pp=" + L.pp + " dp=" + L.dp + (L.ep > 1 ? " ep=" + L.ep : "") + " ZeRO-" + L.zero
      + " b=" + L.mb + (L.sp ? " SP" : "") + " recompute=" + L.rc;
  }
  function key(L) { return [L.tp, L.pp, L.dp, L.ep, L.zero, L.mb, L.sp ? 1 : 0, L.rc].join(","); }
  function cell(tr, text, value) {
    var td = document.createElement("td");
    td.textContent = text;
    if (value !== undefined) td.dataset.value = String(value);
    tr.appendChild(td);
  }

  var SHOW = 20;

  // The page's Python, for the form's inputs: the same plan from reference_impl/parallel/planner.py.
  function python(v, preset) {
    return "import dataclasses\n\nfrom reference_impl.parallel import planner as P\n\n"
      + "model = P.Model(layers=" + v.layers + ", hidden=" + v.hidden + ", heads=" + v.heads + ", seq=" + v.seq
      + ", vocab=" + v.vocab + ", experts=" + v.experts + ", top_k=" + v.top_k + ")\n"
      + "cluster = dataclasses.replace(P.PRESETS[" + JSON.stringify(preset) + "](nodes=" + v.nodes
      + "), efficiency=" + v.efficiency + ")\n"
      + "result = P.plan(model, cluster, global_batch=" + v.global_batch + ")\n"
      + "if result.ranked:\n"
      + "    print(P.explain(result.ranked[0].layout, model, cluster, " + v.global_batch + "))\n"
      + "print(result.reasons())  # how many layouts were dropped, by reason\n";
  }

  function render(form, k) {
    var get = function (name) { return form.querySelector('[name="' + name + '"]'); };
    var problem = null, v = {};
    form.querySelectorAll("input").forEach(function (el) {
      var x = Number(el.value), min = Number(el.min || 0), whole = el.step === "1";
      if (problem === null && (el.value === "" || !isFinite(x) || x < min || (whole && !Number.isInteger(x)))) {
        problem = (el.dataset.label || el.name) + " must be " + (whole ? "a whole number" : "a number")
          + " of at least " + min;
      }
      v[el.name] = x;
    });
    if (problem === null && v.efficiency > 1) problem = "efficiency must be at most 1";
    if (problem === null && v.hidden % v.heads) problem = "the hidden size must be a multiple of the number of heads";
    if (problem === null && v.top_k > v.experts) problem = "top-k must be at most the number of experts";
    var summary = form.querySelector('output[name="summary"]');
    var body = form.querySelector("tbody.ranked"), dropped = form.querySelector("tbody.dropped");
    var reasons = form.querySelector("tbody.reasons");
    [body, dropped, reasons].forEach(function (t) { t.textContent = ""; });
    form.querySelectorAll("output").forEach(function (o) { o.textContent = ""; o.dataset.value = ""; });
    // calculators.js (loaded on every page, before DOMContentLoaded) finds the page's code block
    var snippet = window.LabCalculators ? window.LabCalculators.snippetAfter(form) : null;
    if (problem !== null) {
      summary.textContent = "enter valid numbers: " + problem;
      if (snippet) snippet.textContent = "# enter valid numbers: " + problem + "\n";
      return;
    }
    if (snippet) snippet.textContent = python(v, get("preset").value);

    var preset = k.clusters[get("preset").value];
    var c = { gpus_per_node: preset.gpus_per_node, gpus: v.nodes * preset.gpus_per_node,
              memory_bytes: preset.memory_bytes, peak_flops: preset.peak_flops, efficiency: v.efficiency,
              usable_fraction: preset.usable_fraction, intra: preset.intra, inter: preset.inter };
    var m = model(v), B = v.global_batch;
    var result = plan(m, c, B, k);
    var total = result.ranked.length + result.invalid.length + result.tooBig.length;
    summary.dataset.value = String(result.ranked.length);
    summary.textContent = total + " layouts of " + c.gpus + " GPUs for a " + (m.parameters / 1e9).toFixed(2)
      + "B-parameter model (" + (m.active / 1e9).toFixed(2) + "B active per token): " + result.ranked.length
      + " fit, " + result.tooBig.length + " do not fit in memory, " + result.invalid.length + " cannot run.";

    result.ranked.slice(0, SHOW).forEach(function (est, i) {
      var tr = document.createElement("tr"), L = est.L;
      tr.dataset.layout = key(L);
      cell(tr, String(i + 1));
      cell(tr, label(L));
      cell(tr, String(Math.floor(B / (L.dp * L.mb))));
      cell(tr, gb(est.memory.total), est.memory.total);
      cell(tr, secs(est.time.total), est.time.total);
      var flops = stepFlops(m, B, "none") / est.time.total / c.gpus;
      cell(tr, (100 * flops / c.peak_flops).toFixed(1) + " %", flops / c.peak_flops);
      cell(tr, ["compute", "tp", "ep", "p2p", "zero_per_microbatch", "bubble", "dp"].map(function (part) {
        return est.time[part] > 0 ? part.replace(/_/g, " ") + " " + secs(est.time[part]) : null;
      }).filter(Boolean).join(", "));
      body.appendChild(tr);
    });

    var counts = {};
    k.reasons.forEach(function (r) { counts[r] = { n: 0, example: null }; });
    result.invalid.forEach(function (x) {
      counts[x.kind].n++;
      if (!counts[x.kind].example) counts[x.kind].example = x;
    });
    counts.memory.n = result.tooBig.length;
    k.reasons.forEach(function (r) {
      var out = form.querySelector('output[name="reason_' + r + '"]');
      if (out) { out.dataset.value = String(counts[r].n); out.textContent = String(counts[r].n); }
      if (!counts[r].example) return;
      var tr = document.createElement("tr");
      tr.dataset.kind = r;
      cell(tr, label(counts[r].example.L));
      cell(tr, counts[r].example.reason);
      reasons.appendChild(tr);
    });

    result.tooBig.slice(0, SHOW).forEach(function (est) {
      var tr = document.createElement("tr"), L = est.L;
      tr.dataset.layout = key(L);
      cell(tr, label(L));
      cell(tr, gb(est.memory.total), est.memory.total);
      cell(tr, secs(est.time.total), est.time.total);
      cell(tr, "needs " + gb(est.memory.total) + ", " + gb(c.memory_bytes * c.usable_fraction) + " usable");
      dropped.appendChild(tr);
    });

    if (result.ranked.length) {
      var top = result.ranked[0];
      Object.keys(top.time).forEach(function (part) {
        var out = form.querySelector('output[name="top_' + part + '"]');
        if (out) { out.dataset.value = String(top.time[part]); out.textContent = secs(top.time[part]); }
      });
      Object.keys(top.memory).forEach(function (part) {
        var out = form.querySelector('output[name="top_memory_' + part + '"]');
        if (out) { out.dataset.value = String(top.memory[part]); out.textContent = gb(top.memory[part]); }
      });
      var best = form.querySelector('output[name="top_layout"]');
      best.dataset.value = key(top.L);
      best.textContent = label(top.L);
      ["tp", "dp", "pp"].forEach(function (g) {
        var out = form.querySelector('output[name="top_link_' + g + '"]');
        var stride = { tp: 1, dp: top.L.tp, pp: top.L.tp * top.L.dp }[g], size = top.L[g];
        var where = groupLink(c, stride, size).where;
        out.dataset.value = where;
        out.textContent = where;
      });
    } else {
      form.querySelector('output[name="top_layout"]').textContent = "no layout fits: see the dropped ones below";
    }
  }

  function init() {
    var node = document.getElementById("calculator-constants");
    var form = document.querySelector("form[data-layout-planner]");
    if (!node || !form) return;
    var k = JSON.parse(node.textContent).parallel_layout;
    var select = form.querySelector('[name="preset"]');
    Object.keys(k.clusters).forEach(function (name) {
      var o = document.createElement("option");
      o.value = name;
      o.textContent = k.clusters[name].name;
      select.appendChild(o);
    });
    select.value = select.dataset.default;
    var efficiency = form.querySelector('[name="efficiency"]');
    efficiency.value = String(k.clusters[select.value].efficiency);
    select.addEventListener("change", function () { efficiency.value = String(k.clusters[select.value].efficiency); });
    function update() { render(form, k); }
    form.addEventListener("input", update);
    form.addEventListener("change", update);
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    update();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
