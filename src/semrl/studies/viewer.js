// semrl run report: line charts and the reasoning-tree viewer. No dependencies, no network.
// Every piece of run data (model text included) reaches the page through textContent, never HTML.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("run-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2f6fb3", "#d0423a", "#2e9e44", "#8a4fbf", "#e08a1e", "#178a8a"];

  function el(tag, attrs, parent, text) {
    const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e4 || a < 1e-3)) return v.toExponential(2);
    return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(3);
  }

  // ---------------------------------------------------------------- line charts
  function chart(parent, title, series) {
    const box = el("div", { class: "chart", "data-metric": title }, parent);
    el("h3", {}, box, title);
    const W = 360, H = 190, L = 46, R = 10, T = 8, B = 24;
    const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: "100%" }, box);
    const pts = series.flatMap((s) => s.points);
    if (!pts.length) return;
    let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 + 1e-3; y1 += Math.abs(y1) * 0.1 + 1e-3; }
    const pad = (y1 - y0) * 0.06; y0 -= pad; y1 += pad;
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const y = y0 + ((y1 - y0) * i) / 4;
      el("svg:line", { class: "grid", x1: L, x2: W - R, y1: sy(y), y2: sy(y) }, svg);
      el("svg:text", { x: L - 4, y: sy(y) + 3, "text-anchor": "end" }, svg, fmt(y));
    }
    // integer step ticks at an even spacing of 1, 2, 5, 10, 20, 50, ... (at most about 10)
    const spacing = [1, 2, 5].flatMap((m) => [1, 10, 100, 1000, 10000].map((p) => m * p))
      .sort((a, b) => a - b).find((d) => (x1 - x0) / d <= 10) || Math.ceil((x1 - x0) / 10);
    for (let x = Math.ceil(x0 / spacing) * spacing; x <= x1; x += spacing) {
      el("svg:text", { x: sx(x), y: H - B + 13, "text-anchor": "middle" }, svg, String(x));
    }
    el("svg:line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }, svg);
    el("svg:line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }, svg);
    el("svg:text", { x: W - R, y: H - 2, "text-anchor": "end" }, svg, "step");
    series.forEach((s, i) => {
      const color = PALETTE[i % PALETTE.length];
      const d = s.points.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      el("svg:path", { class: "line", d, stroke: color }, svg);
      for (const p of s.points) {
        const dot = el("svg:circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.4, fill: color }, svg);
        el("svg:title", {}, dot, `${s.name} step ${p[0]}: ${fmt(p[1])}`);
      }
      if (series.length > 1) {
        el("svg:text", { x: L + 6, y: T + 10 + 11 * i, fill: color }, svg, s.name);
      }
    });
  }

  function table(parent, columns, rows) {
    const t = el("table", {}, parent);
    const head = el("tr", {}, el("thead", {}, t));
    columns.forEach((c) => el("th", {}, head, c));
    const body = el("tbody", {}, t);
    for (const row of rows) {
      const tr = el("tr", {}, body);
      row.forEach((v) => el("td", {}, tr, typeof v !== "number" ? String(v) : Number.isInteger(v) ? String(v) : fmt(v)));
    }
    return t;
  }

  // ---------------------------------------------------------------- reasoning trees
  function advColor(a) {
    if (Math.abs(a) < 1e-6) return "#b9c1ca";
    const t = Math.min(1, Math.abs(a) / 0.5);
    return a > 0 ? `rgba(46,158,68,${0.35 + 0.65 * t})` : `rgba(208,66,58,${0.35 + 0.65 * t})`;
  }
  function advBackground(a) {
    if (Math.abs(a) < 1e-6) return "transparent";
    const t = Math.min(1, Math.abs(a) / 0.5);
    return a > 0 ? `rgba(46,158,68,${0.12 + 0.3 * t})` : `rgba(208,66,58,${0.12 + 0.3 * t})`;
  }

  function rowOrder(chains) {
    // depth-first: each chain directly above its children, roots and fresh chains in creation order
    const kids = chains.map(() => []);
    const roots = [];
    chains.forEach((c) => (c.parent >= 0 ? kids[c.parent].push(c.chain) : roots.push(c.chain)));
    const order = [];
    const visit = (c) => { order.push(c); kids[c].forEach(visit); };
    roots.forEach(visit);
    return order;
  }

  function showChain(tree, chain) {
    const detail = document.getElementById("detail");
    detail.textContent = "";
    const c = tree.chains[chain];
    el("p", {}, detail,
      `Chain ${c.chain} (${c.parent >= 0 ? `branched from chain ${c.parent} at token ${c.branch_position}` : "sampled from the prompt"}), ` +
      `${c.length} tokens. Answer: ${c.answer === null ? "none" : c.answer} (gold ${tree.gold}), reward ${fmt(c.reward)}, ` +
      `${c.correct ? "correct" : "wrong"}.`);
    const text = el("div", { id: "path-text" }, detail);
    c.segments.forEach((s) => {
      const span = el("span", { class: "segment", style: `background:${advBackground(s.advantage)}` }, text, s.text);
      span.title = `tokens ${s.start}-${s.end}: advantage ${fmt(s.advantage)}`;
    });
    const segs = el("p", { class: "hint" }, detail);
    segs.textContent = "Segments: " + c.segments.map((s) => `[${s.start}, ${s.end}) A=${fmt(s.advantage)}`).join("  ");
  }

  function showBranch(tree, chain) {
    const detail = document.getElementById("detail");
    detail.textContent = "";
    const c = tree.chains[chain];
    const b = c.branch || {};
    el("p", { id: "branch-info" }, detail,
      `Branch point of chain ${c.chain}: token ${c.branch_position} of chain ${c.parent}. ` +
      `Generation entropy H = ${fmt(b.entropy)}, semantic divergence SD = ${fmt(b.divergence)}, score = ${fmt(b.score)}.`);
  }

  function drawTree(tree) {
    const view = document.getElementById("tree-view");
    view.textContent = "";
    document.getElementById("tree-problem").textContent =
      `Step ${tree.step}, problem ${tree.problem_id}: ${tree.problem}  (gold: ${tree.gold})`;
    const chains = tree.chains;
    const order = rowOrder(chains);
    const row = {};
    order.forEach((c, i) => (row[c] = i));
    const maxLen = Math.max(1, ...chains.map((c) => c.length));
    const RH = 26, L = 60, R = 150, T = 24;
    const W = Math.max(700, Math.min(1600, maxLen * 6 + L + R));
    const H = T + RH * chains.length + 10;
    const svg = el("svg:svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "tree-svg" }, view);
    const sx = (k) => L + (k / maxLen) * (W - L - R);
    const sy = (c) => T + RH * row[c] + RH / 2;
    el("svg:text", { x: L, y: 12 }, svg, "token 0");
    el("svg:text", { x: W - R, y: 12, "text-anchor": "end" }, svg, `token ${maxLen}`);
    const rootChains = chains.filter((c) => c.parent < 0).map((c) => c.chain);
    el("svg:line", { x1: L, x2: L, y1: sy(rootChains[0]), y2: sy(rootChains[rootChains.length - 1]), stroke: "#6b7785", "stroke-width": 2 }, svg);
    const prompt = el("svg:circle", { cx: L, cy: sy(rootChains[0]), r: 6, fill: "#6b7785", class: "prompt-node" }, svg);
    el("svg:title", {}, prompt, "prompt");
    const scores = chains.filter((c) => c.branch).map((c) => c.branch.score);
    const [s0, s1] = [Math.min(0, ...scores), Math.max(1e-9, ...scores)];
    for (const c of chains) {
      const y = sy(c.chain);
      el("svg:text", { x: L - 8, y: y + 3, "text-anchor": "end" }, svg, `#${c.chain}`);
      if (c.parent >= 0) {
        el("svg:path", { d: `M${sx(c.branch_position)},${sy(c.parent)} C${sx(c.branch_position)},${y} ${sx(c.branch_position)},${y} ${sx(c.branch_position) + 8},${y}`,
          fill: "none", stroke: "#9aa5b1", "stroke-width": 1.5 }, svg);
      }
      for (const s of c.segments) {
        if (c.parent >= 0 && s.end <= c.branch_position) continue; // drawn on the parent's line
        const a = Math.max(s.start, c.parent >= 0 ? c.branch_position : 0);
        const seg = el("svg:line", { x1: sx(a), x2: sx(s.end), y1: y, y2: y, stroke: advColor(s.advantage), "stroke-width": 5, class: "segment-line" }, svg);
        el("svg:title", {}, seg, `chain ${c.chain}, tokens ${s.start}-${s.end}: advantage ${fmt(s.advantage)}`);
        el("svg:line", { x1: sx(s.start), x2: sx(s.start), y1: y - 4, y2: y + 4, stroke: "#ffffff", "stroke-width": 1 }, svg);
      }
      const leaf = el("svg:circle", { cx: sx(c.length), cy: y, r: 6, fill: c.correct ? "#2e9e44" : "#d0423a",
        class: "leaf", "data-chain": c.chain }, svg);
      el("svg:title", {}, leaf, `chain ${c.chain}: answer ${c.answer}, reward ${fmt(c.reward)}`);
      leaf.addEventListener("click", () => {
        svg.querySelectorAll(".leaf.selected").forEach((n) => n.classList.remove("selected"));
        leaf.classList.add("selected");
        showChain(tree, c.chain);
      });
      el("svg:text", { x: sx(c.length) + 10, y: y + 3 }, svg,
        `${c.answer === null ? "no answer" : String(c.answer).slice(0, 18)}  r=${fmt(c.reward)}`);
    }
    for (const c of chains) {
      if (c.parent < 0 || !c.branch) continue;
      const t = (c.branch.score - s0) / (s1 - s0 || 1);
      const bp = el("svg:circle", { cx: sx(c.branch_position), cy: sy(c.parent), r: 4 + 3 * t,
        fill: `rgba(240,160,32,${0.45 + 0.55 * t})`, stroke: "#b06d00", class: "branch-point", "data-chain": c.chain }, svg);
      el("svg:title", {}, bp, `branch to chain ${c.chain} at token ${c.branch_position}: H ${fmt(c.branch.entropy)}, SD ${fmt(c.branch.divergence)}, score ${fmt(c.branch.score)}`);
      bp.addEventListener("click", () => showBranch(tree, c.chain));
    }
  }

  function treeViewer() {
    const controls = document.getElementById("tree-controls");
    const trees = DATA.trees;
    if (!trees.length) {
      el("p", { class: "hint" }, controls, "This run saved no rollout trees (only tree methods such as ROSE make them; logging.trees_per_step sets how many).");
      return;
    }
    el("label", { for: "tree-select" }, controls, "Tree: ");
    const select = el("select", { id: "tree-select" }, controls);
    trees.forEach((t, i) => el("option", { value: i }, select, `step ${t.step} · ${t.problem_id} · ${t.chains.length} chains`));
    select.addEventListener("change", () => drawTree(trees[Number(select.value)]));
    drawTree(trees[0]);
  }

  // ---------------------------------------------------------------- page
  document.getElementById("run-summary").textContent = DATA.summary;
  const train = document.getElementById("train-charts");
  DATA.train_curves.forEach((c) => chart(train, c.metric, c.series));
  const evalBox = document.getElementById("eval-table");
  if (DATA.eval_table.rows.length) table(evalBox, DATA.eval_table.columns, DATA.eval_table.rows);
  else el("p", { class: "hint" }, evalBox, "No evaluation in this run (data.eval, logging.eval_every).");
  const evalCharts = document.getElementById("eval-charts");
  DATA.eval_curves.forEach((c) => chart(evalCharts, c.metric, c.series));
  treeViewer();
  document.getElementById("config-text").textContent = DATA.config_text;
  document.body.setAttribute("data-ready", "1");
})();
