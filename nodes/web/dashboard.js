// The ppnode dashboard: draws GET /v1/status (see nodes/dashboard.go).
// Plain JavaScript and SVG, no dependency. Every update redraws at a cost
// bounded whatever the cluster's size or the job's length: at most
// MAX_MEMBERS members, MAX_JOBS jobs, MAX_GANTT_CELLS cells of the Gantt
// chart, MAX_PASS_BOXES passes of the schedule, MAX_POINTS points per
// curve, MAX_EVENTS rows of events and MAX_LINKS links; a part whose HTML
// did not change is not touched.
'use strict';
(() => {
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.max(250, Number(params.get('poll')) || 2000);
  const MAX_MEMBERS = 256, MAX_JOBS = 6, MAX_LINKS = 64, MAX_EVENTS = 12, MAX_STAGE_BOXES = 64;
  const MAX_POINTS = 400; // drawn per curve
  const MAX_HISTORY = 4000; // points a page keeps per curve
  const MAX_GANTT_CELLS = 256; // steps × stages drawn
  const MAX_PASS_BOXES = 2048; // passes drawn, measured and simulated
  const MAX_PASS_STAGES = 24; // stages drawn in the schedule
  const MAX_MARKS = 200; // marks per kind on a timeline

  const stats = { updates: 0, renderMS: 0, maxRenderMS: 0, fetches: 0, fetchErrors: 0, lastError: '', pollMS: POLL_MS };
  const views = new Map(); // job key -> view (see jobView)
  const $ = (id) => document.getElementById(id);

  // --- formatting -------------------------------------------------------
  const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ESC[c]);
  // A stage's name: its group, and which replica when the group has several.
  const stageName = (sg, S) => S.filter((q) => q.group === sg.group).length > 1
    ? `stage ${esc(sg.group)} replica ${esc(sg.replica || 0)}` : `stage ${esc(sg.group ?? sg.id)}`;
  const isNum = (v) => typeof v === 'number' && isFinite(v);
  function num(v, digits) {
    if (!isNum(v)) return '–';
    if (digits != null) return v.toFixed(digits);
    const a = Math.abs(v);
    if (a >= 100 || v === 0) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toPrecision(3);
  }
  function bytes(b) {
    if (!isNum(b) || b <= 0) return '0 B';
    const u = ['B', 'kB', 'MB', 'GB', 'TB'];
    let i = 0;
    while (b >= 1000 && i < u.length - 1) { b /= 1000; i++; }
    return num(b) + ' ' + u[i];
  }
  const ms = (v) => num(v) + ' ms';
  const rate = (mbit) => (mbit >= 1000 ? num(mbit / 1000) + ' Gbit/s' : num(mbit) + ' Mbit/s');
  function count(c) {
    const u = ['', 'k', 'M', 'G', 'T'];
    let i = 0;
    while (c >= 1000 && i < u.length - 1) { c /= 1000; i++; }
    return num(c) + u[i];
  }
  const short = (s, n) => { s = String(s ?? ''); return s.length > n ? s.slice(0, n - 1) + '…' : s; };
  const badge = (s) => `<span class="badge st-${esc(s)}">${esc(s)}</span>`;
  const f1 = (v) => (isNum(v) ? v.toFixed(1) : '0');
  const tick = (v) => String(+v.toPrecision(6));

  // thin keeps at most max points of pts, evenly spaced, and the last.
  function thin(pts, max) {
    if (pts.length <= max) return pts;
    const out = [], stride = (pts.length - 1) / (max - 1);
    for (let i = 0; i < max - 1; i++) out.push(pts[Math.floor(i * stride)]);
    out.push(pts[pts.length - 1]);
    return out;
  }
  // ticks are about n round values from lo to hi.
  function ticks(lo, hi, n) {
    const span = hi - lo;
    if (!(span > 0)) return [lo];
    const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / mag;
    const step = (r >= 7.5 ? 10 : r >= 3.5 ? 5 : r >= 1.5 ? 2 : 1) * mag;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9 && out.length < 20; v += step) out.push(v);
    return out;
  }
  // keep appends p to a page history, halving it when full.
  function keep(hist, p) {
    hist.push(p);
    if (hist.length > MAX_HISTORY) {
      const half = hist.filter((_, i) => i % 2 === 0 || i === hist.length - 1);
      hist.length = 0;
      hist.push(...half);
    }
  }

  // chart draws series ([{pts: [[x, y]], cls, dots}]) on shared axes.
  function chart(series, o) {
    o = o || {};
    const W = o.W || 440, H = o.H || 160, L = 48, R = 26, T = 8, B = 28;
    series = series.map((s) => ({ ...s, pts: thin(s.pts.filter((p) => isNum(p[0]) && isNum(p[1])), MAX_POINTS) }));
    const all = series.flatMap((s) => s.pts);
    if (!all.length) return `<p class="muted">${esc(o.empty || 'nothing yet')}</p>`;
    let x0 = o.x0 ?? Math.min(...all.map((p) => p[0])), x1 = o.x1 ?? Math.max(...all.map((p) => p[0]));
    let y0 = o.y0 ?? Math.min(...all.map((p) => p[1])), y1 = o.y1 ?? Math.max(...all.map((p) => p[1]));
    if (!(x1 > x0)) x1 = x0 + 1;
    if (!(y1 > y0)) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    let s = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(o.label || '')}">`;
    for (const v of ticks(y0, y1, 4)) {
      s += `<line class="grid" x1="${L}" x2="${W - R}" y1="${f1(sy(v))}" y2="${f1(sy(v))}"/>`;
      s += `<text class="muted" x="${L - 4}" y="${f1(sy(v) + 3)}" text-anchor="end">${esc(tick(v))}</text>`;
    }
    for (const v of ticks(x0, x1, 5)) {
      s += `<text class="muted" x="${f1(sx(v))}" y="${H - B + 14}" text-anchor="middle">${esc(tick(v))}</text>`;
    }
    s += `<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/><line class="axis" x1="${L}" x2="${L}" y1="${T}" y2="${H - B}"/>`;
    if (o.xLabel) s += `<text class="muted" x="${W - R}" y="${H - 2}" text-anchor="end">${esc(o.xLabel)}</text>`;
    for (const se of series) {
      if (se.pts.length > 1 || !se.dots) {
        s += `<path class="${se.cls}" d="M${se.pts.map((p) => f1(sx(p[0])) + ',' + f1(sy(p[1]))).join('L')}"/>`;
      }
      if (se.dots) {
        for (const p of se.pts) s += `<circle class="${se.dots}" cx="${f1(sx(p[0]))}" cy="${f1(sy(p[1]))}" r="3"><title>${esc(num(p[0]) + ': ' + num(p[1]))}</title></circle>`;
      }
    }
    return s + '</svg>';
  }

  // --- members ------------------------------------------------------------
  function renderMembers(st) {
    const mine = {}; // node -> "job: stage k"
    const speed = {}; // node -> measured speed at the latest re-plan
    for (const j of st.jobs || []) {
      if (j.state === 'done' || j.state === 'failed' || j.state === 'diverged') continue;
      for (const sg of j.stages || []) (mine[sg.node] = mine[sg.node] || []).push(`${j.id}: stage ${sg.id}`);
      const r = (j.replans || [])[(j.replans || []).length - 1];
      if (r && r.speeds) Object.assign(speed, r.speeds);
    }
    const ms = (st.members || []).slice().sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    let h = '<div class="scroll"><table><thead><tr><th>node</th><th>state</th><th class="num">GFLOP/s</th><th class="num">CPU limit</th>' +
      '<th class="num">threads</th><th class="num">memory</th><th class="num">measured speed</th><th>stages</th><th>HTTP</th><th>version</th></tr></thead><tbody>';
    for (const m of ms.slice(0, MAX_MEMBERS)) {
      const p = m.name === st.name ? { ...m.profile, cpu_limit: (st.profile || {}).cpu_limit } : m.profile || {};
      h += `<tr data-member="${esc(m.name)}"><td>${esc(m.name)}${m.name === st.name ? ' <span class="muted">(this node)</span>' : ''}</td>` +
        `<td>${badge(m.state)}${m.error ? ` <span class="error">${esc(m.error)}</span>` : ''}</td>` +
        `<td class="num">${num(p.gflops)}</td><td class="num">${p.cpu_limit ? num(p.cpu_limit) + ' CPU' : '<span class="muted">none</span>'}</td>` +
        `<td class="num">${esc(p.threads ?? '–')}</td><td class="num">${bytes(p.memory_bytes)}</td>` +
        `<td class="num">${isNum(speed[m.name]) ? '×' + num(speed[m.name]) : '–'}</td>` +
        `<td>${esc(short((mine[m.name] || []).join(', '), 40))}</td><td>${esc(m.http || '')}</td><td class="muted">${esc(m.version || '')}</td></tr>`;
    }
    h += '</tbody></table></div>';
    if (ms.length > MAX_MEMBERS) h += `<p class="muted">and ${ms.length - MAX_MEMBERS} more</p>`;
    const alive = ms.filter((m) => m.state === 'alive').length;
    return `<p class="muted">${alive} alive of ${ms.length}</p>` + h;
  }

  // --- a job ----------------------------------------------------------------
  const PARTS = ['head', 'plan', 'gantt', 'passes', 'loss', 'acc', 'sps', 'timeline', 'events', 'links'];
  function jobView(key) {
    const el = document.createElement('section');
    el.className = 'job';
    el.innerHTML = '<div class="jobhead" data-part="head"></div><div class="grid">' +
      '<div class="wide"><h3>Plan</h3><div data-part="plan" class="plan"></div></div>' +
      '<div class="wide"><h3>Last steps, as the stages measured them</h3><div data-part="gantt" class="gantt"></div>' +
      '<div class="legend"><span><i class="fwd"></i>forward</span><span><i class="bwd"></i>backward</span><span><i class="upd"></i>update</span>' +
      '<span><i class="wait"></i>waiting (data plane)</span><span><i class="send"></i>sending on its links (overlaps)</span>' +
      '<span>each stage\'s times are totals over the step\'s micro-batches; gaps between steps are cuts and probes</span></div></div>' +
      '<div class="wide"><h3>The newest step\'s schedule, as it ran and as simulated</h3><div data-part="passes" class="passes"></div>' +
      '<div class="legend"><span><i class="fwd"></i>forward (and loss)</span><span><i class="bwd"></i>backward (input gradients, under zero-bubble)</span>' +
      '<span><i class="wgt"></i>weight gradients</span><span><i class="rec"></i>recomputation</span><span><i class="upd"></i>update</span>' +
      '<span>per stage, the measured row above the simulated one; numbers are micro-batches</span></div></div>' +
      '<div><h3>Training loss</h3><div data-part="loss" class="losschart"></div></div>' +
      '<div><h3 data-title="acc">Test accuracy</h3><div data-part="acc" class="accchart"></div></div>' +
      '<div><h3>Samples/s</h3><div data-part="sps" class="spschart"></div></div>' +
      '<div class="wide"><h3>Timeline: re-plans, recoveries, cuts (by step)</h3><div data-part="timeline" class="timeline"></div>' +
      '<div class="legend"><span><i class="replan"></i>re-plan</span><span><i class="recovery"></i>recovery (and the steps replayed)</span>' +
      '<span><i class="cut"></i>cut</span><span><i class="takeover"></i>takeover</span></div>' +
      '<div data-part="events" class="events"></div></div>' +
      '<div class="wide"><h3>Links</h3><div data-part="links" class="links"></div></div></div>';
    const v = { key, el, parts: {}, loss: [], sps: [], cuts: [], lastStep: -1, lastCut: -1, t0: performance.now() };
    for (const p of PARTS) v.parts[p] = { el: el.querySelector(`[data-part="${p}"]`), html: null };
    return v;
  }
  function setPart(v, name, html) {
    const p = v.parts[name];
    if (p.html !== html) { p.el.innerHTML = html; p.html = html; }
  }
  // lossHistory is the job's loss per step: its own if the node sends it,
  // else what this page saw.
  function lossHistory(j, v) {
    const h = j.loss_history || (j.result && j.result.loss_history);
    if (Array.isArray(h) && h.length) return h.map((p) => (Array.isArray(p) ? p : [p.step, p.loss]));
    return v.loss;
  }

  function head(j) {
    const pct = j.total ? Math.min(100, (100 * j.step) / j.total) : 0;
    const acc = (j.accuracy || [])[(j.accuracy || []).length - 1];
    const r = j.result;
    let h = `<h2>${esc(j.id)}</h2>${badge(j.state)}`;
    if (j.reason) h += `<span class="muted">${esc(j.reason)}</span>`;
    if (j.error) h += `<span class="error">${esc(j.error)}</span>`;
    h += `<span class="kv">${esc(j.model)}</span>`;
    h += `<span class="kv"><svg class="progress" viewBox="0 0 100 8" preserveAspectRatio="none"><rect class="track" width="100" height="8"/>` +
      `<rect class="bar" width="${pct.toFixed(1)}" height="8"/></svg> step <b>${esc(j.step)}</b> / ${esc(j.total)}</span>`;
    h += `<span class="kv">loss <b>${num(j.loss, 4)}</b>${j.loss_name && j.loss_name !== 'ce' ? ' (' + esc(j.loss_name) + ')' : ''}</span>`;
    h += `<span class="kv"><b>${num(j.samples_per_sec)}</b> samples/s</span>`;
    const ev = j.evaluation;
    if (ev && ev.samples > 0) h += `<span class="kv">evaluating the weights after step ${esc(ev.step)}: <b>${esc(ev.done)}</b> / ${esc(ev.samples)} test samples</span>`;
    if (r && isNum(r.test_accuracy) && r.test_accuracy > 0) h += `<span class="kv">test accuracy <b>${num(r.test_accuracy, 4)}</b></span>`;
    else if (acc) h += `<span class="kv">accuracy <b>${num(acc.accuracy, 4)}</b> (after step ${esc(acc.step)})</span>`;
    if (r && r.loss && r.loss !== 'ce' && isNum(r.test_loss)) h += `<span class="kv">test loss (${esc(r.loss)}) <b>${num(r.test_loss, 4)}</b></span>`;
    if (r && r.test_auc > 0) h += `<span class="kv">test AUC <b>${num(r.test_auc, 4)}</b></span>`;
    else if (acc && acc.auc > 0) h += `<span class="kv">AUC <b>${num(acc.auc, 4)}</b> (after step ${esc(acc.step)})</span>`;
    h += `<span class="kv muted">coordinator ${esc(j.coordinator)}${(j.holders || []).length ? ', copies on ' + esc(j.holders.join(', ')) : ''}</span>`;
    if (j.takeover) h += `<span class="kv muted">taken over from ${esc(j.takeover.from)} at step ${esc(j.takeover.step)}</span>`;
    if (j.moved_to) h += `<span class="kv error">moved to ${esc(j.moved_to)}</span>`;
    h += '<div class="plantext full">';
    if (j.plan) h += `plan <span title="${esc(j.plan)}">${esc(short(j.plan, 400))}</span> · `;
    if (j.schedule) h += `${esc(j.schedule)}, ${esc(j.micro_batches)} micro-batches · `;
    if ((j.tied || []).length) h += `tied weights ${esc(j.tied.join('; '))} · `;
    if (isNum(j.predicted_step_ms) && j.predicted_step_ms > 0) h += `predicted step ${ms(j.predicted_step_ms)}${isNum(j.predicted_bubble) ? ', bubble ' + Math.round(100 * j.predicted_bubble) + '%' : ''} · `;
    const last = (j.last_steps || [])[(j.last_steps || []).length - 1];
    if (last) h += `last step ${ms(last.wall_ms)} · `;
    if (j.cuts) h += `${esc(j.cuts)} cuts, latest at step ${esc(j.latest_cut)}${j.checkpoint_every ? ', every ' + esc(j.checkpoint_every) + ' steps' : ''}`;
    return h + '</div>';
  }

  // planSVG draws the stages as boxes in columns by their depth in the
  // stage graph, wrapped into rows of at most 8 columns.
  function planSVG(j) {
    const S = (j.stages || []).slice(0, MAX_STAGE_BOXES), n = S.length;
    if (!n) return '<p class="muted">no plan yet</p>';
    const hasTo = S.some((s) => Array.isArray(s.to));
    const to = S.map((s, k) => (hasTo ? (s.to || []) : k < n - 1 ? [k + 1] : []).filter((t) => t >= 0 && t < n && t !== k));
    const depth = new Array(n).fill(0);
    for (let pass = 0; pass < n; pass++) {
      let changed = false;
      for (let k = 0; k < n; k++) for (const t of to[k]) if (depth[t] < depth[k] + 1) { depth[t] = depth[k] + 1; changed = true; }
      if (!changed) break;
    }
    const cols = Math.max(...depth) + 1, perRow = Math.min(cols, 8);
    const byCol = [];
    S.forEach((_, k) => (byCol[depth[k]] = byCol[depth[k]] || []).push(k));
    const labels = n <= 16; // the links' rates and codecs on the edges
    const BW = 164, BH = 60, GX = labels ? 96 : 44, GY = 12, GB = 28, P = 6;
    const pos = new Array(n);
    let y = P;
    for (let b = 0; b * perRow < cols; b++) {
      let tallest = 0;
      for (let c = b * perRow; c < Math.min(cols, (b + 1) * perRow); c++) {
        (byCol[c] || []).forEach((k, i) => (pos[k] = [P + (c - b * perRow) * (BW + GX), y + i * (BH + GY)]));
        tallest = Math.max(tallest, (byCol[c] || []).length);
      }
      y += tallest * (BH + GY) - GY + GB;
    }
    const W = P * 2 + perRow * (BW + GX) - GX, H = y - GB + P;
    const busy = S.map((s) => (s.forward_ms || 0) + (s.backward_ms || 0) + (s.update_ms || 0));
    const worst = Math.max(...busy) > 0 ? busy.indexOf(Math.max(...busy)) : -1;
    const link = (a, b, kind) => (j.links || []).find((l) => l.from === a && l.to === b);
    let s = `<svg class="fit" viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="stage graph">`;
    S.forEach((_, k) => {
      for (const t of to[k]) {
        const [x1, y1] = pos[k], [x2, y2] = pos[t];
        const ax = x1 + BW, ay = y1 + BH / 2, bx = x2 - 5, by = y2 + BH / 2, mx = (ax + bx) / 2;
        s += `<path class="edge" d="M${ax},${ay} C${mx},${ay} ${mx},${by} ${bx},${by}"/>`;
        s += `<polygon class="arrowhead" points="${bx + 5},${by} ${bx - 1},${by - 4} ${bx - 1},${by + 4}"/>`;
        const l = labels && link(S[k].node, S[t].node);
        if (l) {
          const kind = (l.kinds || []).find((q) => q.kind === 'activation');
          const ym = (ay + by) / 2;
          s += `<text class="muted" x="${f1(mx)}" y="${f1(ym - 5)}" text-anchor="middle">${esc(rate(l.mbit_per_s))}</text>`;
          if (kind) s += `<text class="muted" x="${f1(mx)}" y="${f1(ym + 12)}" text-anchor="middle">${esc(kind.codec)} ×${esc(num(kind.ratio))}</text>`;
        }
      }
    });
    S.forEach((sg, k) => {
      const [x, yy] = pos[k];
      s += `<g class="stagebox" data-stage="${esc(sg.id)}"><rect class="stage${k === worst ? ' bottleneck' : ''}" x="${x}" y="${yy}" width="${BW}" height="${BH}" rx="4"/>` +
        `<text x="${x + 6}" y="${yy + 14}"><tspan font-weight="600">${stageName(sg, S)}</tspan> on ${esc(short(sg.node, 12))}</text>` +
        `<text class="muted" x="${x + 6}" y="${yy + 28}">${esc(short(sg.layers, 24))}${sg.params ? ' · ' + esc(count(sg.params)) + ' params' : ''}</text>` +
        `<text x="${x + 6}" y="${yy + 42}">f ${num(sg.forward_ms)} · b ${num(sg.backward_ms)} · w ${num(sg.wait_ms)}</text>` +
        `<text class="muted" x="${x + 6}" y="${yy + 55}">ms per step${k === worst ? ' · busiest' : ''}${sg.recompute ? ' · recomputes' : ''}</text>` +
        `<title>${stageName(sg, S)} on ${esc(sg.node)}: ${esc(sg.layers)}, ${esc(sg.micro_batches)} of each step's micro-batches</title></g>`;
    });
    s += '</svg>';
    if ((j.stages || []).length > n) s += `<p class="muted">and ${j.stages.length - n} more stages</p>`;
    return s;
  }

  // ganttSVG draws the last steps: a row per stage, each step's bar from
  // its start (the stages start together) split into its measured times.
  function ganttSVG(j) {
    const all = j.last_steps || [];
    if (!all.length) return '<p class="muted">no step measured yet</p>';
    const nst = Math.max(1, ...all.map((st) => (st.stages || []).length));
    const steps = all.slice(-Math.max(1, Math.floor(MAX_GANTT_CELLS / nst)));
    const t0 = steps[0].at_ms;
    const t1 = Math.max(...steps.map((st) => st.at_ms + Math.max(st.wall_ms, ...(st.stages || []).map((c) => c.wall_ms || 0))));
    const span = t1 - t0 > 0 ? t1 - t0 : 1;
    const W = 960, L = 120, R = 24, T = 18, rowH = nst > 24 ? 7 : nst > 12 ? 12 : 20, H = T + nst * rowH + 26;
    const sx = (t) => L + ((t - t0) / span) * (W - L - R);
    const w = (d) => Math.max(0, (d / span) * (W - L - R));
    let s = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="Gantt chart of the last steps">`;
    const labelEvery = Math.ceil(nst / Math.floor((nst * rowH) / 11));
    for (let k = 0; k < nst; k++) {
      if (k % labelEvery) continue;
      const sg = (j.stages || [])[k];
      const lab = sg && (j.stages || []).length === nst ? `stage ${k} · ${short(sg.node, 10)}` : `stage ${k}`;
      s += `<text x="${L - 6}" y="${f1(T + k * rowH + rowH / 2 + 4)}" text-anchor="end">${esc(lab)}</text>`;
    }
    for (const st of steps) {
      const x = sx(st.at_ms);
      s += `<line class="grid" x1="${f1(x)}" x2="${f1(x)}" y1="${T - 4}" y2="${T + nst * rowH}"/>`;
      if (w(st.wall_ms) > 40) s += `<text class="muted" x="${f1(x + 2)}" y="${T - 6}">step ${esc(st.step)}</text>`;
      (st.stages || []).forEach((c, k) => {
        const y = T + k * rowH + 1, h = rowH - 2;
        let cur = st.at_ms, cells = '';
        for (const [cls, d] of [['fwd', c.forward_ms], ['bwd', c.backward_ms], ['upd', c.update_ms], ['wait', c.wait_ms]]) {
          if (d > 0) cells += `<rect class="${cls}" x="${f1(sx(cur))}" y="${y}" width="${f1(w(d))}" height="${h}"/>`;
          cur += d || 0;
        }
        if (c.send_ms > 0) cells += `<rect class="send" x="${f1(x)}" y="${y + h - Math.max(2, h / 4)}" width="${f1(w(c.send_ms))}" height="${f1(Math.max(2, h / 4))}"/>`;
        s += `<g class="cell">${cells}<rect class="wall" x="${f1(x)}" y="${y}" width="${f1(w(c.wall_ms))}" height="${h}"><title>step ${esc(st.step)}, stage ${k}: ` +
          `forward ${ms(c.forward_ms)}, backward ${ms(c.backward_ms)}, update ${ms(c.update_ms)}, waiting ${ms(c.wait_ms)}, sending ${ms(c.send_ms)}; whole ${ms(c.wall_ms)}</title></rect></g>`;
      });
    }
    const yb = T + nst * rowH;
    s += `<line class="axis" x1="${L}" x2="${W - R}" y1="${yb}" y2="${yb}"/>`;
    for (const v of ticks(0, span, 6)) s += `<text class="muted" x="${f1(sx(t0 + v))}" y="${yb + 14}" text-anchor="middle">${esc(tick(v))}</text>`;
    s += `<text class="muted" x="${W - R}" y="${H - 2}" text-anchor="end">ms</text>`;
    s += '</svg>';
    if (steps.length < all.length) s += `<p class="muted">the last ${steps.length} of ${all.length} steps measured (${nst} stages)</p>`;
    return s;
  }

  // PASS_CLASS colours a pass by its instruction.
  const PASS_CLASS = { forward: 'fwd', loss: 'fwd', backward: 'bwd', backward_input: 'bwd', weight: 'wgt', recompute: 'rec', step: 'upd' };

  // passesSVG draws the newest step's passes per stage as they ran (from
  // the stage's start of the step) above the simulator's: the schedule, its
  // bubbles, and where the prediction and the run part.
  function passesSVG(j) {
    const all = j.last_steps || [];
    const newest = all[all.length - 1];
    const measured = newest ? j.passes || [] : [];
    const predicted = j.predicted_passes || [];
    const nst = Math.min(MAX_PASS_STAGES, Math.max(measured.length, predicted.length));
    if (!measured.some((ps) => ps.length)) return '<p class="muted">no step measured yet</p>';
    const rows = [];
    let boxes = 0;
    for (let k = 0; k < nst; k++) {
      for (const [ps, cls] of [[measured[k] || [], 'ran'], [predicted[k] || [], 'sim']]) {
        const take = ps.slice(0, Math.max(0, MAX_PASS_BOXES - boxes));
        boxes += take.length;
        rows.push({ k, cls, ps: take });
      }
    }
    const end = (ps) => Math.max(0, ...ps.map((p) => p.start_ms + p.ms));
    const span = Math.max(1e-3, ...rows.map((r) => end(r.ps)), ...(newest.stages || []).slice(0, nst).map((c) => c.wall_ms || 0));
    const W = 960, L = 120, R = 24, T = 8, rowH = nst > 12 ? 8 : 14, gap = nst > 12 ? 2 : 6, H = T + nst * (2 * rowH + gap) + 24;
    const sx = (t) => L + (t / span) * (W - L - R);
    let s = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="the newest step's passes per stage, measured and simulated">`;
    for (const r of rows) {
      const y = T + r.k * (2 * rowH + gap) + (r.cls === 'sim' ? rowH : 0);
      const sg = (j.stages || [])[r.k];
      if (r.cls === 'ran') s += `<text x="${L - 6}" y="${f1(y + rowH)}" text-anchor="end">${esc(sg ? `stage ${r.k} · ${short(sg.node, 10)}` : `stage ${r.k}`)}</text>`;
      for (const p of r.ps) {
        const x = sx(p.start_ms), wd = Math.max(0.5, (p.ms / span) * (W - L - R));
        s += `<rect class="${PASS_CLASS[p.op] || 'wait'} ${r.cls}" x="${f1(x)}" y="${f1(y + 1)}" width="${f1(wd)}" height="${rowH - 2}">` +
          `<title>stage ${esc(r.k)}, ${r.cls === 'ran' ? 'measured' : 'simulated'}: ${esc(p.op)} of micro-batch ${esc(p.micro)} at ${ms(p.start_ms)} for ${ms(p.ms)}</title></rect>`;
        if (wd > 14 && rowH >= 14 && p.op !== 'step') s += `<text class="passlabel" x="${f1(x + wd / 2)}" y="${f1(y + rowH - 3)}" text-anchor="middle">${esc(p.micro)}</text>`;
      }
    }
    const yb = T + nst * (2 * rowH + gap);
    s += `<line class="axis" x1="${L}" x2="${W - R}" y1="${yb}" y2="${yb}"/>`;
    for (const v of ticks(0, span, 6)) s += `<text class="muted" x="${f1(sx(v))}" y="${yb + 14}" text-anchor="middle">${esc(tick(v))}</text>`;
    s += `<text class="muted" x="${W - R}" y="${H - 2}" text-anchor="end">ms after the step began</text>`;
    s += '</svg>';
    const more = Math.max(measured.length, predicted.length) - nst;
    if (more > 0) s += `<p class="muted">and ${more} more stages</p>`;
    if (boxes >= MAX_PASS_BOXES) s += `<p class="muted">the first ${MAX_PASS_BOXES} passes drawn</p>`;
    return s;
  }

  // timelineSVG marks re-plans, recoveries, cuts and a takeover on the
  // job's steps.
  function timelineSVG(j, v) {
    const last = Math.max(j.step || 0, ...(j.replans || []).slice(-MAX_MARKS).map((r) => r.step), ...(j.recoveries || []).map((r) => r.step), ...v.cuts.slice(-MAX_MARKS));
    const total = Math.max(1, Math.min(j.total || 1, Math.ceil(last * 1.05) + 1));
    const W = 960, L = 16, R = 24, H = 58, y0 = 30;
    const sx = (st) => L + (Math.min(Math.max(st, 0), total) / total) * (W - L - R);
    let s = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="timeline">`;
    s += `<line class="axis" x1="${L}" x2="${W - R}" y1="${y0}" y2="${y0}"/>`;
    for (const t of ticks(0, total, 10)) s += `<text class="muted" x="${f1(sx(t))}" y="${H - 4}" text-anchor="middle">${esc(tick(t))}</text>`;
    for (const c of v.cuts.slice(-MAX_MARKS)) s += `<line class="ev-cut" x1="${f1(sx(c))}" x2="${f1(sx(c))}" y1="${y0 - 6}" y2="${y0 + 6}"><title>cut at step ${esc(c)}</title></line>`;
    for (const r of (j.recoveries || []).slice(-MAX_MARKS)) {
      const x = sx(r.step);
      s += `<line class="replay" x1="${f1(sx(r.step - r.replayed))}" x2="${f1(x)}" y1="${y0}" y2="${y0}"/>`;
      s += `<path class="ev-recovery" d="M${f1(x - 5)},${y0 + 5}L${f1(x + 5)},${y0 + 15}M${f1(x + 5)},${y0 + 5}L${f1(x - 5)},${y0 + 15}"><title>recovery at step ${esc(r.step)}: ${esc(r.cause)}</title></path>`;
    }
    for (const r of (j.replans || []).slice(-MAX_MARKS)) {
      const x = sx(r.step);
      s += `<polygon class="ev-replan" points="${f1(x)},${y0 - 2} ${f1(x - 6)},${y0 - 14} ${f1(x + 6)},${y0 - 14}"><title>re-plan at step ${esc(r.step)} (${esc(r.trigger)}): ${esc(r.reason)}</title></polygon>`;
    }
    if (j.takeover) {
      const x = sx(j.takeover.step);
      s += `<polygon class="ev-takeover" points="${f1(x)},${y0 - 8} ${f1(x + 6)},${y0} ${f1(x)},${y0 + 8} ${f1(x - 6)},${y0}"><title>taken over from ${esc(j.takeover.from)}</title></polygon>`;
    }
    const x = sx(j.step);
    s += `<line class="now" x1="${f1(x)}" x2="${f1(x)}" y1="4" y2="${y0 + 10}"/><text x="${f1(Math.min(x + 3, W - 60))}" y="12">step ${esc(j.step)}</text>`;
    return s + '</svg>';
  }

  function eventsTable(j) {
    const ev = [];
    for (const r of (j.replans || []).slice(-MAX_EVENTS)) {
      let d = r.before_ms > 0 ? `predicted ${ms(r.before_ms)} → ${ms(r.after_ms)} (gain ${num(100 * (r.gain || 0))}%)` : `predicted ${ms(r.after_ms)}`;
      if (r.measured_before_ms) d += `, measured ${ms(r.measured_before_ms)} → ${r.measured_after_ms ? ms(r.measured_after_ms) : '…'}`;
      d += `; moved ${bytes(r.state_bytes)} ${esc(r.method || '')} in ${ms(r.moved_ms)}`;
      ev.push({ step: r.step, cls: 'replan', trigger: r.trigger, what: `re-plan (${r.trigger})`, why: r.reason, plan: r.plan, d });
    }
    for (const r of (j.recoveries || []).slice(-MAX_EVENTS)) {
      ev.push({ step: r.step, cls: 'recovery', trigger: 'failure', what: 'recovery', why: r.cause, plan: r.plan,
        d: `replayed ${r.replayed} steps; detected in ${ms(r.detect_ms)}, restored in ${ms(r.restore_ms)}` });
    }
    if (j.takeover) {
      const t = j.takeover;
      ev.push({ step: t.step, cls: 'takeover', trigger: 'takeover', what: 'takeover', why: `${t.from} → ${t.to}`, plan: '',
        d: `from the cut at step ${t.step} (${t.source}), prepared in ${ms(t.prepare_ms)}` });
    }
    if (!ev.length) return '<p class="muted">no re-plan, recovery or takeover</p>';
    ev.sort((a, b) => b.step - a.step);
    let h = '<table><thead><tr><th class="num">step</th><th>what</th><th>why</th><th>plan</th><th>details</th></tr></thead><tbody>';
    for (const e of ev.slice(0, MAX_EVENTS)) {
      h += `<tr class="${e.cls}" data-trigger="${esc(e.trigger)}"><td class="num">${esc(e.step)}</td><td>${esc(e.what)}</td>` +
        `<td title="${esc(e.why)}">${esc(short(e.why, 60))}</td><td class="plantext" title="${esc(e.plan)}">${esc(short(e.plan, 50))}</td><td class="details">${e.d}</td></tr>`;
    }
    return h + '</tbody></table>';
  }

  function linksTable(j) {
    const ls = j.links || [];
    if (!ls.length) return '<p class="muted">no link measured</p>';
    let h = '<div class="scroll"><table><thead><tr><th>link</th><th class="num">rate</th><th class="num">RTT</th><th class="num">traffic bound</th>' +
      '<th class="num">sent</th><th>codecs (raw/wire)</th></tr></thead><tbody>';
    for (const l of ls.slice(0, MAX_LINKS)) {
      const kinds = (l.kinds || []).map((k) => `${k.kind}: ${k.codec} ×${num(k.ratio)}`).join(', ');
      h += `<tr><td>${esc(l.from)} → ${esc(l.to)}</td><td class="num">${rate(l.mbit_per_s)} <span class="muted">${esc(l.source)}</span></td>` +
        `<td class="num">${ms(l.rtt_ms)}</td><td class="num">${l.traffic_mbit_per_s ? rate(l.traffic_mbit_per_s) : '–'}</td>` +
        `<td class="num">${bytes(l.wire_bytes)}</td><td>${esc(kinds) || '<span class="muted">–</span>'}</td></tr>`;
    }
    h += '</tbody></table></div>';
    if (ls.length > MAX_LINKS) h += `<p class="muted">and ${ls.length - MAX_LINKS} more links</p>`;
    return h;
  }

  function updateJob(v, j) {
    // What the page keeps between updates: the loss at each step it saw
    // (if the node sends no history), samples/s, the cuts.
    if (j.step > v.lastStep && j.step > 0) {
      keep(v.loss, [j.step, j.loss]);
      v.lastStep = j.step;
    }
    if (j.latest_cut > 0 && j.latest_cut !== v.lastCut) {
      v.cuts.push(j.latest_cut);
      if (v.cuts.length > MAX_MARKS) v.cuts.shift();
      v.lastCut = j.latest_cut;
    }
    if (!['done', 'failed', 'diverged'].includes(j.state) && isNum(j.samples_per_sec) && j.samples_per_sec > 0) {
      keep(v.sps, [(performance.now() - v.t0) / 1000, j.samples_per_sec]);
    }
    setPart(v, 'head', head(j));
    setPart(v, 'plan', planSVG(j));
    setPart(v, 'gantt', ganttSVG(j));
    setPart(v, 'passes', passesSVG(j));
    setPart(v, 'loss', chart([{ pts: lossHistory(j, v), cls: 'loss' }], { xLabel: 'step', label: 'training loss', empty: 'no step done yet', x0: 0 }));
    // Under an error loss (mse, l1, huber) there is no accuracy: the test loss instead;
    // under the binary cross-entropy the AUC.
    const auc = (j.accuracy || []).filter((a) => a.auc > 0).map((a) => [a.step, a.auc]);
    const title = j.no_accuracy ? `Test loss (${j.loss_name})` : auc.length ? 'Test AUC' : 'Test accuracy';
    const h3 = v.el.querySelector('[data-title="acc"]');
    if (h3.textContent !== title) h3.textContent = title;
    const empty = 'not measured yet (at the end, or every --eval-every steps)';
    if (j.no_accuracy) {
      const tl = (j.accuracy || []).filter((a) => isNum(a.test_loss)).map((a) => [a.step, a.test_loss]);
      setPart(v, 'acc', chart([{ pts: tl, cls: 'acc', dots: 'accpt' }], { xLabel: 'step', label: 'test loss', empty, y0: 0 }));
    } else if (auc.length) {
      setPart(v, 'acc', chart([{ pts: auc, cls: 'acc', dots: 'accpt' }], { xLabel: 'step', label: 'test AUC', empty, y0: 0, y1: 1 }));
    } else {
      const acc = (j.accuracy || []).map((a) => [a.step, a.accuracy]);
      setPart(v, 'acc', chart([{ pts: acc, cls: 'acc', dots: 'accpt' }], { xLabel: 'step', label: 'test accuracy', empty, y0: 0, y1: 1 }));
    }
    setPart(v, 'sps', chart([{ pts: v.sps, cls: 'sps' }], { xLabel: 's watched', label: 'samples per second', empty: 'not training', y0: 0 }));
    setPart(v, 'timeline', timelineSVG(j, v));
    setPart(v, 'events', eventsTable(j));
    setPart(v, 'links', linksTable(j));
  }

  function renderJobs(st) {
    const list = (st.jobs || []).slice(-MAX_JOBS).reverse();
    const box = $('jobs');
    const seen = new Set();
    list.forEach((j, i) => {
      const key = j.id + '@' + j.started;
      let v = views.get(key);
      if (!v) { v = jobView(key); views.set(key, v); }
      v.el.dataset.job = j.id;
      v.el.dataset.state = j.state;
      seen.add(key);
      if (box.children[i] !== v.el) box.insertBefore(v.el, box.children[i] || null);
      updateJob(v, j);
    });
    for (const [key, v] of views) if (!seen.has(key)) { v.el.remove(); views.delete(key); }
    for (const el of Array.from(box.children)) if (!el.classList.contains('job')) el.remove();
    if (!list.length) box.innerHTML = '<p class="empty">No job coordinated by this node yet.</p>';
  }

  function renderRecords(st) {
    const rs = st.records || [];
    $('records-section').hidden = !rs.length;
    if (!rs.length) return '';
    const http = {};
    for (const m of st.members || []) http[m.name] = m.http;
    let h = '<table><thead><tr><th>job</th><th>state</th><th>coordinator</th><th>copies on</th></tr></thead><tbody>';
    for (const r of rs.slice(0, MAX_JOBS * 4)) {
      const a = http[r.coordinator] ? `<a href="${esc(location.protocol + '//' + http[r.coordinator] + '/')}">${esc(r.coordinator)}</a>` : esc(r.coordinator);
      h += `<tr><td>${esc(r.id)}</td><td>${badge(r.state)}</td><td>${a}</td><td>${esc((r.holders || []).join(', '))}</td></tr>`;
    }
    return h + '</tbody></table>';
  }

  const sections = { members: { el: null, html: null }, records: { el: null, html: null } };
  function setSection(name, html) {
    const p = sections[name];
    p.el = p.el || $(name);
    if (p.html !== html) { p.el.innerHTML = html; p.html = html; }
  }

  // render draws a status (GET /v1/status).
  function render(st) {
    const t = performance.now();
    $('node').textContent = `${st.name} · ${st.version || ''} · ${st.http || ''}`;
    setSection('members', renderMembers(st));
    renderJobs(st);
    setSection('records', renderRecords(st));
    const d = performance.now() - t;
    stats.updates++;
    stats.renderMS = d;
    stats.maxRenderMS = Math.max(stats.maxRenderMS, d);
  }

  // --- polling, only while the page is visible -----------------------------
  let timer = 0, inflight = false;
  function conn(text, bad) {
    const el = $('conn');
    el.textContent = text;
    el.classList.toggle('error', !!bad);
  }
  function schedule() {
    clearTimeout(timer);
    timer = 0;
    if (document.visibilityState === 'visible') timer = setTimeout(poll, POLL_MS);
  }
  async function poll() {
    timer = 0;
    if (inflight || document.visibilityState !== 'visible') return;
    inflight = true;
    stats.fetches++;
    try {
      const r = await fetch('/v1/status', { cache: 'no-store', credentials: 'same-origin' });
      const body = await r.json().catch(() => ({}));
      if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
      render(body);
      conn(`updated ${new Date().toLocaleTimeString()} · every ${POLL_MS / 1000} s while visible`);
    } catch (e) {
      stats.fetchErrors++;
      stats.lastError = String((e && e.message) || e);
      conn(`cannot read the status: ${stats.lastError}`, true);
    } finally {
      inflight = false;
      schedule();
    }
  }
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') {
      if (!timer && !inflight) poll();
    } else {
      clearTimeout(timer);
      timer = 0;
      conn('paused while the page is hidden');
    }
  });
  window.ppnodeDashboard = { stats, render };
  poll();
})();
