// The operator's page in Debian's chromium, driven by playwright-core (which never downloads a
// browser: executablePath is the system's). Run by tests/integration/ui_browser.sh, which starts
// the servers; this prints one "ok - ..." / "not ok - ..." line per check and exits 0.
//
//   node ui_check.mjs single URL OUTDIR           a node without --cluster
//   node ui_check.mjs cluster URL OUTDIR          a cluster node (env: KEY, BURST_URL, BURST_BODY,
//                                                 JOINERS "2,3", then waits for "kill" on stdin)
import { chromium } from 'playwright-core';
import readline from 'node:readline';

const [mode, url, outdir] = process.argv.slice(2);
const origin = new URL(url).origin;
const results = [];
const ok = (name, good, why) => {
  const line = good ? `ok - ${name}` : `not ok - ${name}: ${why}`;
  results.push(line);
  console.log(line);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A fresh profile in the scenario's scratch directory (--user-data-dir, which playwright passes).
const browser = await chromium.launchPersistentContext(`${outdir}/chromium-profile`, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1440, height: 1000 },
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
         '--disable-sync', '--no-first-run'],
});
const page = browser.pages()[0] || await browser.newPage();
const foreign = [];
const errors = [];
page.on('request', (r) => { if (!r.url().startsWith(origin + '/') && !r.url().startsWith('data:')) foreign.push(r.url()); });
page.on('pageerror', (e) => errors.push(e.message));
// A fetch answered 401, 404 or 502 is logged by chromium as a console error: those are the page's
// expected answers (no key yet, no --cluster, a member killed); anything else is a bug.
page.on('console', (m) => {
  if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) errors.push(m.text());
});

// Polls fn in the page every 100 ms until it returns a truthy value or ms pass; returns the value.
async function until(ms, fn, arg) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await page.evaluate(fn, arg).catch(() => null);
    if (v || Date.now() > end) return v;
    await sleep(100);
  }
}

async function finish() {
  ok(`${mode}: the page fetched nothing but its own node`, foreign.length === 0, foreign.slice(0, 3).join(' '));
  ok(`${mode}: no script errors`, errors.length === 0, errors.slice(0, 3).join(' | '));
  await browser.close();
  process.exit(0);
}

await page.goto(url, { waitUntil: 'load' });

if (mode === 'single') {
  const row = await until(8000, () => {
    const tr = document.querySelector('#members tbody tr');
    const bar = tr && tr.querySelector('.kbar');
    return tr && bar && bar.dataset.l > 0 && document.querySelector('#summary').textContent.includes('Single node')
      ? { cells: [...tr.cells].map((c) => c.textContent), k: bar.dataset.k, l: bar.dataset.l } : null;
  });
  ok('single: one member row with the model and every layer resident', row && row.k === row.l,
     JSON.stringify(row));
  const planner = await page.evaluate(() => document.querySelector('#planner-sec').hidden);
  ok('single: no planner without --cluster', planner === true, 'the planner section shows');
  // a few requests, then the charts have points: requests/s above 0 in the legend
  const legend = await until(10000, async () => {
    await fetch('/v1/completions', { method: 'POST', body: '{"prompt":"Once","max_tokens":4,"temperature":0}' });
    const t = document.querySelector('#l-rps').textContent;
    const m = /completed ([0-9.]+)/.exec(t);
    return m && Number(m[1]) > 0 ? t : null;
  });
  ok('single: requests/s moves on the chart', !!legend, 'legend never above 0');
  await page.screenshot({ path: `${outdir}/ui_single.png`, fullPage: true });
  await finish();
}

// ---- cluster: the key first (the page asks for it), then the members
const asked = await until(5000, () => {
  const b = document.querySelector('#banner');
  return !b.hidden && b.textContent.includes('API key');
});
ok('cluster: without the key the page asks for it', !!asked, 'no banner asking for the key');
await page.fill('#key', process.env.KEY);
await page.click('#keyform button');
const members = await until(8000, () => document.querySelectorAll('#members tbody tr').length);
ok('cluster: with the key, three members', members === 3, `${members} rows`);

// ---- trigger a scale-out: a burst of long prompts on the serving node
const burst = [];
for (let i = 0; i < 12; i++)
  burst.push(fetch(process.env.BURST_URL, { method: 'POST', body: process.env.BURST_BODY,
    headers: { Authorization: `Bearer ${process.env.KEY}`, 'Content-Type': 'application/json' } }).catch(() => null));

// Watch the joiners' bars in the members table: each value seen, until one reaches L.
const joiners = (process.env.JOINERS || '2,3').split(',');
const seen = {};
let shot = false, joiner = null, chainSeen = null;
const end = Date.now() + 45000;
while (Date.now() < end && !joiner) {
  const s = await page.evaluate((ids) => {
    const out = {};
    for (const id of ids) {
      const b = document.querySelector(`#members tr[data-node="${id}"] .kbar`);
      if (b) out[id] = [Number(b.dataset.k), Number(b.dataset.l)];
    }
    const so = document.querySelector('.scaleout');
    return { bars: out, chain: so ? [...so.querySelectorAll('.hop .name')].map((e) => e.textContent) : null };
  }, joiners).catch(() => ({ bars: {} }));
  if (s.chain && !chainSeen) chainSeen = s.chain;
  for (const [id, [k, L]] of Object.entries(s.bars)) {
    if (L <= 0) continue;
    (seen[id] ||= new Set()).add(k);
    if (k > 0 && k < L && !shot) {
      await page.screenshot({ path: `${outdir}/ui_cluster_scaleout.png`, fullPage: true });
      shot = true;
    }
    if (k === L && [...seen[id]].some((x) => x < L)) joiner = { id, L, seen: [...seen[id]].sort((a, b) => a - b) };
  }
  await sleep(150);
}
ok('cluster: a joiner\'s progress bar moves to L', !!joiner,
   `bars seen ${JSON.stringify(Object.fromEntries(Object.entries(seen).map(([k, v]) => [k, [...v]])))}`);
if (joiner) console.log(`# node ${joiner.id}: k seen ${joiner.seen.join(', ')} of ${joiner.L}`);
ok('cluster: the scale-out\'s chain is drawn', !!chainSeen && chainSeen.length >= 2, JSON.stringify(chainSeen));
const ev = await until(10000, () => {
  const li = document.querySelector('#events li[data-event="scale_up"]');
  return li ? li.textContent : null;
});
ok('cluster: the scale-up appears with its reason', !!ev && /predicted TTFT \d+ ms > SLO 300 ms/.test(ev), ev);
const done = await until(10000, () => !!document.querySelector('#events li[data-event="scale_done"]'));
ok('cluster: the scale-out\'s end appears', !!done, 'no scale_done in the list');
const tok = await until(5000, () => /n1 [0-9.]+/.test(document.querySelector('#l-tok').textContent));
ok('cluster: tokens/s per node charted (node 1 through the page\'s node)', !!tok,
   await page.evaluate(() => document.querySelector('#l-tok').textContent));
await Promise.all(burst);
if (!shot) await page.screenshot({ path: `${outdir}/ui_cluster_scaleout.png`, fullPage: true });
await sleep(1500);
await page.screenshot({ path: `${outdir}/ui_cluster.png`, fullPage: true });

// ---- no leader: the script kills the two other nodes, the page says so
console.log('# kill');
const rl = readline.createInterface({ input: process.stdin });
await new Promise((r) => rl.once('line', r));
const nl = await until(15000, () => {
  const b = document.querySelector('#banner');
  return !b.hidden && b.textContent.startsWith('No leader') ? b.textContent : null;
});
ok('cluster: no leader: the page says so', !!nl, await page.evaluate(() => document.querySelector('#banner').textContent));
await page.screenshot({ path: `${outdir}/ui_no_leader.png`, fullPage: true });
rl.close();
await finish();
