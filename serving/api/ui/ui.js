// The operator's page: every second it reads this node's /v1/cluster (members, scale-outs,
// events) and each live member's /metrics (this node's directly, the others' relayed by this node
// through its forward channels: /v1/cluster/nodes/ID/metrics), and draws the members, the planner
// and the charts. Without --cluster, /v1/cluster is 404 and the page shows this node alone from
// /health and /metrics. Every fetch carries the API key typed above (kept in sessionStorage).
'use strict';

const POLL_MS = 1000;
const WINDOW_S = 300; // the charts' span
const QUANT_S = 15; // percentiles and SLO attainment over the last QUANT_S seconds
const RATE_S = 5; // rates over the last RATE_S seconds (requests finish, and layers land, in bursts)
const FETCH_MS = 2500;
const COLORS = ['#2563eb', '#db2777', '#16a34a', '#ea580c', '#7c3aed', '#0891b2', '#ca8a04', '#475569'];
const EVENT_COLORS = {
  scale_up: '#16a34a', scale_down: '#ea580c', replicate_host: '#2563eb', drop_host: '#64748b',
  scale_done: '#15803d', scale_abandoned: '#dc2626', node_up: '#0891b2', node_down: '#dc2626',
  raft_removed: '#7c3aed', raft_voter: '#7c3aed', raft_recovered: '#7c3aed',
};

const st = {
  key: sessionStorage.getItem('strata.key') || '',
  needKey: false,
  mode: null, // 'cluster' | 'single'
  cluster: null,
  health: null,
  scrapes: new Map(), // node id -> [{t, m}] (m: Map of series -> value)
  inflight: new Set(),
  series: { rps: [], err: [], ttft50: [], ttft99: [], tpot50: [], tpot99: [], slo: [],
            kv: new Map(), tok: new Map(), mbs: new Map() },
  sloTtft: 0, sloTpot: 0,
  opened: Date.now() / 1000,
};

const $ = (id) => document.getElementById(id);

// An element: h('td', {class: 'num'}, 'text', child, ...); strings become text, never HTML.
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'style') e.style.cssText = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}

const colorOf = (id) => COLORS[(Number(id) - 1 + COLORS.length * 64) % COLORS.length];
const now = () => Date.now() / 1000;

function fmtAgo(ms) {
  if (ms === undefined || ms === null) return '\u2014';
  return ms < 1000 ? `${Math.round(ms)} ms ago` : `${(ms / 1000).toFixed(1)} s ago`;
}

function fmtClock(tms) {
  const d = new Date(tms);
  return d.toTimeString().slice(0, 8);
}

// ---------------------------------------------------------------- fetching

async function get(path) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_MS);
  try {
    const headers = {};
    if (st.key) headers.Authorization = 'Bearer ' + st.key;
    return await fetch(path, { headers, signal: ctl.signal, cache: 'no-store' });
  } finally {
    clearTimeout(timer);
  }
}

// Prometheus text: "name{labels} value" lines into a Map keyed by "name{labels}".
function parseProm(text) {
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const sp = line.lastIndexOf(' ');
    if (sp > 0) m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  return m;
}

function sumOf(m, prefix) {
  let s = 0;
  for (const [k, v] of m) if (k === prefix || k.startsWith(prefix + '{')) s += v;
  return s;
}

// Cumulative buckets of histogram name: [[le, count], ...] ascending, +Inf last.
function buckets(m, name) {
  const out = [];
  const p = name + '_bucket{le="';
  for (const [k, v] of m) {
    if (!k.startsWith(p)) continue;
    const le = k.slice(p.length, k.indexOf('"', p.length));
    out.push([le === '+Inf' ? Infinity : Number(le), v]);
  }
  return out.sort((a, b) => a[0] - b[0]);
}

// The q-quantile of cumulative bucket counts, interpolated within its bucket (Prometheus's
// histogram_quantile); in the +Inf bucket, the largest finite bound. null without observations.
function quantile(q, bk) {
  if (!bk.length) return null;
  const total = bk[bk.length - 1][1];
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0, prevC = 0;
  for (const [le, c] of bk) {
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + (le - prevLe) * (c > prevC ? (rank - prevC) / (c - prevC) : 1);
    }
    prevLe = le; prevC = c;
  }
  return prevLe;
}

async function scrape(id, path) {
  if (st.inflight.has(id)) return;
  st.inflight.add(id);
  try {
    const r = await get(path);
    if (!r.ok) return;
    const m = parseProm(await r.text());
    const list = st.scrapes.get(id) || [];
    list.push({ t: now(), m });
    while (list.length && list[0].t < now() - Math.max(QUANT_S, RATE_S) - 5) list.shift();
    st.scrapes.set(id, list);
  } catch (e) {
    // a member that does not answer in time: its series has a gap
  } finally {
    st.inflight.delete(id);
  }
}

async function poll() {
  if (st.needKey) return;
  let r;
  try {
    r = await get(st.mode === 'single' ? '/health' : '/v1/cluster');
  } catch (e) {
    banner(`This node does not answer (${e.name === 'AbortError' ? 'no answer in 2.5 s' : e.message}).`, true);
    return;
  }
  if (r.status === 401) {
    st.needKey = true;
    banner('This node asks for its API key (--api-key): type it in the field above.', true);
    $('key').focus();
    return;
  }
  if (st.mode === null && r.status === 404) {
    st.mode = 'single';
    return poll();
  }
  if (st.mode === 'single') {
    st.health = await r.json().catch(() => null);
    st.cluster = null;
    await scrape(0, '/metrics');
  } else {
    if (!r.ok) {
      banner(`GET /v1/cluster: ${r.status} ${await r.text()}`, true);
      return;
    }
    st.mode = 'cluster';
    st.cluster = await r.json();
    const d = st.cluster;
    const live = d.nodes.filter((n) => n.alive || n.id === d.node_id);
    await Promise.all(live.map((n) =>
      scrape(n.id, n.id === d.node_id ? '/metrics' : `/v1/cluster/nodes/${n.id}/metrics`)));
  }
  sample();
  render();
}

// ---------------------------------------------------------------- series

function push(arr, t, v) {
  arr.push([t, v]);
  while (arr.length && arr[0][0] < t - WINDOW_S) arr.shift();
}

function pushNode(map, id, t, v) {
  if (!map.has(id)) map.set(id, []);
  push(map.get(id), t, v);
}

// One point per chart from the latest scrapes: rates over each node's last RATE_S seconds,
// percentiles and attainment over the bucket deltas of the last QUANT_S seconds, summed over nodes.
function sample() {
  const t = now();
  let rps = 0, err = 0, haveRate = false, met = 0, missed = 0;
  const dT = new Map(), dP = new Map();
  const addDelta = (acc, a, b) => {
    const before = new Map(a);
    for (const [le, c] of b) acc.set(le, (acc.get(le) || 0) + Math.max(0, c - (before.get(le) || 0)));
  };
  for (const [id, list] of st.scrapes) {
    if (!list.length || list[list.length - 1].t < t - 2 * POLL_MS / 1000 - FETCH_MS / 1000) continue;
    const cur = list[list.length - 1];
    const m = cur.m;
    pushNode(st.series.kv, id, t, 100 * (m.get('strata_kv_cache_usage_perc') || 0));
    st.sloTtft = Math.max(st.sloTtft, m.get('strata_slo_ttft_seconds') || 0);
    st.sloTpot = Math.max(st.sloTpot, m.get('strata_slo_tpot_seconds') || 0);
    if (list.length < 2) continue;
    const prev = [...list].reverse().find((x) => x.t <= cur.t - RATE_S) || list[0];
    const dt = cur.t - prev.t;
    if (dt <= 0) continue;
    const rate = (name) => Math.max(0, (sumOf(m, name) - sumOf(prev.m, name)) / dt);
    const done = (x) => (x.get('strata_requests_total{outcome="stop"}') || 0) +
                        (x.get('strata_requests_total{outcome="length"}') || 0);
    const bad = (x) => (x.get('strata_requests_total{outcome="rejected"}') || 0) +
                       (x.get('strata_requests_total{outcome="error"}') || 0);
    rps += Math.max(0, (done(m) - done(prev.m)) / dt);
    err += Math.max(0, (bad(m) - bad(prev.m)) / dt);
    haveRate = true;
    pushNode(st.series.tok, id, t, rate('strata_generation_tokens_total'));
    pushNode(st.series.mbs, id, t, rate('strata_weight_bytes_received') / 1e6);
    const old = list.find((x) => x.t >= cur.t - QUANT_S) || prev;
    if (old === cur) continue;
    addDelta(dT, buckets(old.m, 'strata_time_to_first_token_seconds'), buckets(m, 'strata_time_to_first_token_seconds'));
    addDelta(dP, buckets(old.m, 'strata_request_time_per_output_token_seconds'),
             buckets(m, 'strata_request_time_per_output_token_seconds'));
    met += Math.max(0, sumOf(m, 'strata_slo_met_total') - sumOf(old.m, 'strata_slo_met_total'));
    missed += Math.max(0, sumOf(m, 'strata_slo_missed_total') - sumOf(old.m, 'strata_slo_missed_total'));
  }
  const s = st.series;
  if (haveRate) { push(s.rps, t, rps); push(s.err, t, err); }
  const bt = [...dT].sort((a, b) => a[0] - b[0]), bp = [...dP].sort((a, b) => a[0] - b[0]);
  const ms = (x) => (x === null ? null : x * 1000);
  push(s.ttft50, t, ms(quantile(0.5, bt)));
  push(s.ttft99, t, ms(quantile(0.99, bt)));
  push(s.tpot50, t, ms(quantile(0.5, bp)));
  push(s.tpot99, t, ms(quantile(0.99, bp)));
  push(s.slo, t, met + missed > 0 ? (100 * met) / (met + missed) : null);
}

// ---------------------------------------------------------------- charts

function fmtNum(v) {
  if (v >= 100) return v.toFixed(0);
  if (v >= 10) return v.toFixed(1).replace(/\.0$/, '');
  if (v >= 1) return v.toFixed(2).replace(/\.?0+$/, '');
  return v === 0 ? '0' : String(Number(v.toPrecision(2)));
}

const fmtMs = (v) => (v >= 1000 ? `${fmtNum(v / 1000)} s` : `${fmtNum(v)} ms`);

// The gridline step: 1, 2 or 5 times a power of ten, so that four steps reach top.
function niceStep(top) {
  const raw = top / 4, p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

// lines: [{label, color, pts: [[t, v|null]], dash}]; opts: {fmt, max, min_top, hline: {v, label}}
function chart(id, lines, opts) {
  const cv = $('c-' + id);
  const dpr = window.devicePixelRatio || 1;
  const w = cv.clientWidth, hgt = cv.clientHeight;
  if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(hgt * dpr)) {
    cv.width = Math.round(w * dpr);
    cv.height = Math.round(hgt * dpr);
  }
  const g = cv.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, hgt);
  const fmt = opts.fmt || fmtNum;
  // Since the page opened, up to WINDOW_S: a fresh page fills its charts from the left.
  const t1 = now(), span = Math.min(WINDOW_S, Math.max(60, t1 - st.opened)), t0 = t1 - span;
  let top = opts.max || 0;
  if (!opts.max) {
    for (const l of lines) for (const p of l.pts) if (p[1] !== null && p[0] >= t0 && p[1] > top) top = p[1];
    if (opts.hline && opts.hline.v > 0) top = Math.max(top, opts.hline.v);
    top = Math.max(top * 1.1, opts.min_top || 1);
    top = 4 * niceStep(top);
  }
  g.font = '11px system-ui, sans-serif';
  let L = 0;
  for (let i = 0; i <= 4; i++) L = Math.max(L, g.measureText(fmt((top * i) / 4)).width);
  L = Math.ceil(L) + 10;
  const R = 8, T = 6, B = 18;
  const X = (t) => L + ((t - t0) / (t1 - t0)) * (w - L - R);
  const Y = (v) => T + (1 - v / top) * (hgt - T - B);
  g.strokeStyle = '#eceef1';
  g.fillStyle = '#8a93a3';
  g.lineWidth = 1;
  g.textAlign = 'right';
  g.textBaseline = 'middle';
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4, y = Math.round(Y(v)) + 0.5;
    g.beginPath(); g.moveTo(L, y); g.lineTo(w - R, y); g.stroke();
    g.fillText(fmt(v), L - 5, y);
  }
  g.textAlign = 'center';
  g.textBaseline = 'alphabetic';
  for (const [a, label] of timeTicks(span)) if (X(t1 - a) >= L + 8) g.fillText(label, Math.min(X(t1 - a), w - R - 12), hgt - 4);
  if (opts.hline && opts.hline.v > 0) {
    const y = Math.round(Y(opts.hline.v)) + 0.5;
    g.strokeStyle = '#dc2626';
    g.setLineDash([5, 4]);
    g.beginPath(); g.moveTo(L, y); g.lineTo(w - R, y); g.stroke();
    g.setLineDash([]);
    g.fillStyle = '#dc2626';
    g.textAlign = 'right';
    g.fillText(opts.hline.label, w - R - 2, y - 3);
  }
  for (const l of lines) {
    g.strokeStyle = l.color;
    g.lineWidth = 1.8;
    g.setLineDash(l.dash ? [4, 3] : []);
    g.beginPath();
    let pen = false;
    const dots = [];
    l.pts.forEach(([t, v], i) => {
      if (v === null || t < t0) { pen = false; return; }
      const x = X(t), y = Y(Math.min(v, top));
      if (pen) g.lineTo(x, y); else g.moveTo(x, y);
      const next = l.pts[i + 1];
      if (!pen && (!next || next[1] === null)) dots.push([x, y]); // alone: a line would not show
      pen = true;
    });
    g.stroke();
    g.setLineDash([]);
    g.fillStyle = l.color;
    for (const [x, y] of dots) { g.beginPath(); g.arc(x, y, 2, 0, 2 * Math.PI); g.fill(); }
  }
  const lg = $('l-' + id);
  lg.replaceChildren(...lines.map((l) => {
    const last = [...l.pts].reverse().find((p) => p[1] !== null);
    const val = last ? ` ${fmt(last[1])}` : '';
    return h('span', {}, h('i', { class: l.dash ? 'dash' : null, style: `background:${l.color};color:${l.color}` }),
             l.label + val);
  }));
}

// Labels for a time axis of span seconds ending now: [[seconds ago, "-30s"], ...], at most 8.
function timeTicks(span) {
  const step = [10, 15, 30, 60, 120].find((x) => span / x <= 7) || 120;
  const out = [];
  for (let a = 0; a <= span + 0.01; a += step)
    out.push([a, a === 0 ? 'now' : a < 60 || a % 60 ? `-${a}s` : `-${a / 60}m`]);
  return out;
}

function perNode(map, label) {
  return [...map].sort((a, b) => a[0] - b[0]).map(([id, pts]) =>
    ({ label: id === 0 ? label : `n${id}`, color: id === 0 ? COLORS[0] : colorOf(id), pts }));
}

function drawCharts() {
  const s = st.series;
  const pct = (v) => `${fmtNum(v)}%`;
  chart('rps', [{ label: 'completed', color: '#2563eb', pts: s.rps },
                { label: 'rejected or failed', color: '#dc2626', pts: s.err }], { min_top: 1 });
  chart('ttft', [{ label: 'P50', color: '#2563eb', pts: s.ttft50 },
                 { label: 'P99', color: '#7c3aed', pts: s.ttft99, dash: true }],
        { fmt: fmtMs, min_top: 10, hline: { v: st.sloTtft * 1000, label: `SLO ${fmtMs(st.sloTtft * 1000)}` } });
  chart('tpot', [{ label: 'P50', color: '#2563eb', pts: s.tpot50 },
                 { label: 'P99', color: '#7c3aed', pts: s.tpot99, dash: true }],
        { fmt: fmtMs, min_top: 1, hline: { v: st.sloTpot * 1000, label: `SLO ${fmtMs(st.sloTpot * 1000)}` } });
  chart('slo', [{ label: 'met both SLOs', color: '#15803d', pts: s.slo }], { fmt: pct, max: 100 });
  chart('kv', perNode(s.kv, 'this node'), { fmt: pct, max: 100 });
  chart('tok', perNode(s.tok, 'this node'), { min_top: 1 });
  chart('mbs', perNode(s.mbs, 'this node'), { fmt: (v) => `${fmtNum(v)} MB/s`, min_top: 0.1 });
}

// ---------------------------------------------------------------- members

function latest(id) {
  const list = st.scrapes.get(id);
  return list && list.length ? list[list.length - 1] : null;
}

// k of L: the member's own /metrics while fresh (it moves as layers land), else the committed
// holding (a heartbeat or two behind).
function layersOf(id, hold) {
  const s = latest(id);
  if (s && now() - s.t < 5) {
    const L = s.m.get('strata_layers_total') || 0, k = s.m.get('strata_layers_resident') || 0;
    if (L > 0 && (!hold || !hold.layers || hold.layers === L)) return [k, L];
  }
  return hold && hold.layers ? [hold.layers_resident, hold.layers] : null;
}

function kbar(id, kl) {
  if (!kl) return h('div', { class: 'kbar none', 'data-node': id, 'data-k': 0, 'data-l': 0 }, h('span', {}, '\u2014'));
  const [k, L] = kl;
  const bar = h('div', { class: 'kbar' + (k >= L ? ' full' : ''), 'data-node': id, 'data-k': k, 'data-l': L },
                h('div', { class: 'fill', style: `width:${(100 * k) / L}%` }), h('span', {}, `${k} / ${L}`));
  return bar;
}

// Updates the bar in place, so its width slides instead of jumping.
function setKbar(cell, id, kl) {
  const old = cell.querySelector('.kbar');
  if (!old || !kl || old.classList.contains('none')) { cell.replaceChildren(kbar(id, kl)); return; }
  const [k, L] = kl;
  old.dataset.k = k; old.dataset.l = L;
  old.classList.toggle('full', k >= L);
  old.querySelector('.fill').style.width = `${(100 * k) / L}%`;
  old.querySelector('span').textContent = `${k} / ${L}`;
}

function row(tbody, id) {
  let tr = tbody.querySelector(`tr[data-node="${id}"]`);
  if (!tr) {
    tr = h('tr', { 'data-node': id });
    for (let i = 0; i < 11; i++) tr.append(h('td', { class: i >= 9 ? 'num' : null }));
    const after = [...tbody.rows].find((r) => Number(r.dataset.node) > Number(id));
    tbody.insertBefore(tr, after || null);
  }
  return tr;
}

function setCells(tr, cells) {
  cells.forEach((c, i) => {
    if (c === undefined) return;
    const td = tr.children[i];
    if (typeof c === 'string' || typeof c === 'number') { if (td.textContent !== String(c)) td.textContent = c; }
    else td.replaceChildren(c);
  });
}

function badge(text, cls) { return h('span', { class: 'badge ' + (cls || text) }, text); }

function renderMembers() {
  const tbody = $('members').tBodies[0];
  const d = st.cluster;
  if (!d) {
    const hl = st.health || {};
    const tr = row(tbody, 0);
    const kl = hl.layers_total ? [hl.layers_resident, hl.layers_total] : null;
    setCells(tr, [h('span', {}, 'this node', h('span', { class: 'addr' }, location.host)), badge('single node', 'voter'),
                  '\u2014', hl.model || '\u2014', '\u2014', undefined,
                  badge(hl.status === 'ok' ? 'serving' : hl.stage || 'loading', hl.status === 'ok' ? 'serving' : 'joining'),
                  badge('alive'), '\u2014', String((hl.waiting || 0) + (hl.running || 0)), tokRate(0)]);
    setKbar(tr.children[5], 0, kl);
    return;
  }
  const seen = new Set();
  for (const n of d.nodes) {
    seen.add(String(n.id));
    const tr = row(tbody, n.id);
    tr.classList.toggle('dead', !n.alive);
    const eng = n.models.find((x) => x.engine);
    const host = n.models.find((x) => x.host);
    const model = (eng || host || {}).name || '\u2014';
    const kl = eng ? layersOf(n.id, eng) : null;
    const role = n.role === 'joined' ? 'non-voter' : n.role;
    let serving = 'empty';
    if (eng) serving = kl && kl[0] >= kl[1] ? 'serving' : 'joining';
    else if (host) serving = 'standby';
    const ld = n.load;
    setCells(tr, [
      h('span', {}, `n${n.id}`, n.id === d.node_id ? h('span', { class: 'tag' }, 'this node') : null,
        h('span', { class: 'addr' }, n.http || n.address)),
      badge(role, role === 'non-voter' ? '' : role),
      n.rack || '\u2014', model, host ? '\u2713 whole' : '\u2014', undefined,
      badge(serving), badge(n.alive ? 'alive' : 'dead'),
      ld ? fmtAgo(ld.age_ms) + (ld.relayed ? ' (via leader)' : '') : '\u2014',
      ld ? `${ld.queue} / ${ld.running}` : '\u2014', tokRate(n.id, n.tokens_per_s)]);
    setKbar(tr.children[5], n.id, kl);
  }
  for (const tr of [...tbody.rows]) if (!seen.has(tr.dataset.node)) tr.remove();
}

function tokRate(id, fallback) {
  const pts = st.series.tok.get(id);
  const v = pts && pts.length ? pts[pts.length - 1][1] : fallback;
  return v === undefined || v === null ? '\u2014' : fmtNum(v);
}

// ---------------------------------------------------------------- planner

function eventText(e) {
  const n = `n${e.node}`;
  switch (e.event) {
    case 'scale_up': return `scale up ${e.model} on ${n} from n${e.source}`;
    case 'scale_down': return `scale down ${e.model} on ${n}`;
    case 'replicate_host': return `copy ${e.model} to ${n}'s host memory from n${e.source}`;
    case 'drop_host': return `drop ${e.model}'s host copy on ${n}`;
    case 'scale_done': return `scale-out of ${e.model} done (${n})`;
    case 'scale_abandoned': return `scale-out of ${e.model} abandoned (${n})`;
    case 'node_up': return `${n} up`;
    case 'node_down': return `${n} down`;
    case 'raft_removed': return `${n} removed from raft's voters`;
    case 'raft_voter': return `${n} is a voter`;
    case 'raft_recovered': return `raft recovered on ${n}`;
    default: return `${e.event} ${n}`;
  }
}

function renderPlanner() {
  const d = st.cluster;
  $('planner-sec').hidden = !d;
  if (!d) return;
  const box = $('scaleouts');
  box.replaceChildren(...d.scaleouts.map((so) => {
    const hops = [h('div', { class: 'hop source', 'data-node': so.source }, h('div', { class: 'name' }, `n${so.source}`),
                    h('div', { class: 'addr' }, 'source'))];
    for (const id of so.chain) {
      const n = d.nodes.find((x) => x.id === id);
      const hold = n && n.models.find((x) => x.name === so.model);
      hops.push(h('span', { class: 'arrow' }, '\u2192'),
                h('div', { class: 'hop', 'data-node': id }, h('div', { class: 'name' }, `n${id}`),
                  kbar(id, layersOf(id, hold))));
    }
    const age = (Date.now() - so.started_ms) / 1000;
    return h('div', { class: 'scaleout', 'data-id': so.id },
             h('div', { class: 'head' }, h('b', {}, `${so.kind === 'engine' ? 'Scale-out' : 'Host copy'} #${so.id}`),
               ` \u00b7 ${so.model} \u00b7 started ${age.toFixed(1)} s ago`),
             h('div', { class: 'chain' }, ...hops));
  }));
  const evs = [...d.events].reverse();
  const ol = $('events');
  const key = evs.map((e) => e.seq).join(',');
  if (ol.dataset.key !== key) {
    ol.dataset.key = key;
    ol.replaceChildren(...evs.map((e) => h('li', { class: 'event', 'data-event': e.event, 'data-node': e.node, 'data-seq': e.seq },
      h('span', { class: 't' }, fmtClock(e.t_ms)),
      h('span', { class: 'what' }, h('i', { class: 'ev', style: `background:${EVENT_COLORS[e.event] || '#64748b'}` }), eventText(e)),
      h('span', { class: 'why' }, e.reason || ''))));
  }
  drawTimeline(d.events);
}

// Events as marks on a line, over the time since the first (a minute to ten); scaling decisions
// tall and labelled.
function drawTimeline(events) {
  const cv = $('timeline');
  const dpr = window.devicePixelRatio || 1;
  const w = cv.clientWidth, hgt = cv.clientHeight;
  cv.width = Math.round(w * dpr);
  cv.height = Math.round(hgt * dpr);
  const g = cv.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const t1 = Date.now() / 1000, first = events.length ? events[0].t_ms / 1000 : t1;
  const span = Math.min(600, Math.max(60, (t1 - first) * 1.08));
  const t0 = t1 - span, L = 8, R = 8, base = hgt - 16;
  const X = (t) => L + ((t - t0) / span) * (w - L - R);
  g.strokeStyle = '#cbd5e1';
  g.beginPath(); g.moveTo(L, base + 0.5); g.lineTo(w - R, base + 0.5); g.stroke();
  g.fillStyle = '#8a93a3';
  g.font = '11px system-ui, sans-serif';
  g.textAlign = 'center';
  for (const [a, label] of timeTicks(span)) if (X(t1 - a) >= L + 10) g.fillText(label, Math.min(X(t1 - a), w - R - 14), hgt - 3);
  let lastX = -100;
  for (const e of events) {
    const t = e.t_ms / 1000;
    if (t < t0) continue;
    const x = Math.round(X(t)) + 0.5;
    const big = e.event.startsWith('scale') || e.event.endsWith('_host');
    g.strokeStyle = g.fillStyle = EVENT_COLORS[e.event] || '#64748b';
    g.lineWidth = big ? 2 : 1;
    g.beginPath(); g.moveTo(x, base); g.lineTo(x, base - (big ? 26 : 10)); g.stroke();
    if (big && x - lastX > 46) {
      const label = `${e.event.replace('_host', '').replace('scale_', '')} n${e.node}`;
      const right = x + 3 + g.measureText(label).width > w - R; // near now: left of the mark
      g.textAlign = right ? 'right' : 'left';
      g.fillText(label, right ? x - 3 : x + 3, base - 18);
      lastX = x;
    }
  }
  g.lineWidth = 1;
}

// ---------------------------------------------------------------- the page

function banner(text, bad) {
  const b = $('banner');
  b.hidden = !text;
  b.textContent = text || '';
  b.classList.toggle('bad', !!bad);
}

function renderSummary() {
  const d = st.cluster;
  const s = $('summary');
  if (!d) {
    const hl = st.health || {};
    s.replaceChildren('Single node (no --cluster) \u00b7 ', h('b', {}, hl.model || 'no model yet'), ` \u00b7 ${hl.status || ''}`);
    banner('');
    return;
  }
  const alive = d.nodes.filter((n) => n.alive).length;
  s.replaceChildren('Cluster \u00b7 ', h('b', {}, d.leader ? `leader n${d.leader}` : 'no leader'),
                    ` \u00b7 term ${d.term} \u00b7 ${alive} of ${d.nodes.length} members alive \u00b7 viewed through `,
                    h('b', {}, `n${d.node_id}`), ` (${d.raft_state})`);
  if (d.leader === null || d.leader === undefined)
    banner(`No leader: node ${d.node_id} (${d.raft_state}) hears no leader, so the cluster decides nothing ` +
           '(no scaling, no failure committed) until a majority of its voters is back, or an operator ' +
           'recovers it (POST /v1/cluster/recover, docs/control.md). Requests are still routed on the last ' +
           'committed state; the members below are as this node last knew them.', true);
  else banner('');
}

function render() {
  renderSummary();
  renderMembers();
  renderPlanner();
  drawCharts();
  $('updated').textContent = 'updated ' + new Date().toTimeString().slice(0, 8);
}

$('key').value = st.key;
$('keyform').addEventListener('submit', (ev) => {
  ev.preventDefault();
  st.key = $('key').value.trim();
  sessionStorage.setItem('strata.key', st.key);
  st.needKey = false;
  banner('');
  poll();
});

async function loop() {
  const t = performance.now();
  try { await poll(); } catch (e) { banner('The page failed: ' + e.message, true); }
  setTimeout(loop, Math.max(100, POLL_MS - (performance.now() - t)));
}
window.addEventListener('resize', () => { if (st.mode) render(); });
loop();
