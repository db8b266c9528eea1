// Drives larder's dashboard in headless Chromium (playwright-core with Debian's chromium):
// a wrong token is refused; the right one logs in; requests sent to larder move the counters;
// the cache browser lists an entry and purges it; errors show per route and per backend; the
// charts draw axes with units; the configuration editor shows a refused file's error at its
// line, applies a good one and rolls back. Prints one JSON line of what it saw.
// Usage: node dashboard.mjs ADMIN_URL SITE_URL TOKEN SCREENSHOT_DIR BAD_URL
import { createRequire } from "node:module";
const require = createRequire(process.env.PLAYWRIGHT_DIR + "/");
const { chromium } = require("playwright-core");

const [admin, site, token, shots, bad] = process.argv.slice(2);
const out = {};
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  // Every text the charts draw: their axes' labels.
  await page.addInitScript(() => {
    window.drawn = new Set();
    const fill = CanvasRenderingContext2D.prototype.fillText;
    CanvasRenderingContext2D.prototype.fillText = function (t, ...rest) { window.drawn.add(String(t)); return fill.call(this, t, ...rest); };
  });
  await page.goto(admin + "/_larder/dashboard");
  await page.fill("#token", "wrong");
  await page.click("#login");
  await page.waitForFunction(() => document.querySelector("#login-error").textContent !== "");
  out.wrong_token = await page.textContent("#login-error");

  await page.fill("#token", token);
  await page.click("#login");
  await page.waitForSelector("#app:not(.hidden)");
  await page.waitForFunction(() => document.querySelector("#live").textContent === "live");
  const total = async () => Number((await page.textContent("#total")).replace(/[^0-9.]/g, ""));
  out.total_before = await total();
  for (let i = 0; i < 30; i++) {
    const r = await fetch(site + "/page" + (i % 3), { headers: { "accept-encoding": "gzip" } });
    await r.arrayBuffer();
  }
  // Errors: 404s and 500s from the origin, 502s from a backend that refuses connections.
  for (let i = 0; i < 4; i++) {
    for (const path of ["/missing", "/boom"]) await (await fetch(site + path)).arrayBuffer();
    await (await fetch(bad + "/x" + i)).arrayBuffer();
  }
  await page.waitForFunction((before) => {
    const t = Number(document.querySelector("#total").textContent.replace(/[^0-9.]/g, ""));
    return t >= before + 30;
  }, out.total_before, { timeout: 10000 });
  out.total_after = await total();
  out.hits = Number((await page.textContent("#hits")).replace(/[^0-9.]/g, ""));
  // A second tick so the rate and latency show.
  await page.waitForFunction(() => document.querySelector("#rps").textContent !== "–");
  out.hit_ratio = await page.textContent("#hit-ratio");
  // Hits sent gzip variants: the bandwidth saved shows a share above zero.
  await page.waitForFunction(() => /^[1-9][0-9.]*% · .*\/s$/.test(document.querySelector("#bw-saved").textContent), null, { timeout: 10000 });
  out.bw_saved = await page.textContent("#bw-saved");
  out.bw_out = await page.textContent("#bw-out");
  out.pools = await page.textContent("#pools");
  await page.waitForFunction(() => document.querySelectorAll("#top tr td").length >= 3 * 3, null, { timeout: 10000 });
  out.top = await page.textContent("#top");
  await page.waitForFunction(() => Number(document.querySelector("#err5-total").textContent) >= 8 && Number(document.querySelector("#uperr").textContent) >= 4, null, { timeout: 10000 });
  out.err4_total = await page.textContent("#err4-total");
  out.err5_total = await page.textContent("#err5-total");
  out.uperr = await page.textContent("#uperr");
  out.uperr_kinds = await page.textContent("#uperr-kinds");
  out.routes = await page.$$eval("#routes tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  out.pools_rows = await page.$$eval("#pools tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  out.hit_def = await page.textContent("#hit-def");
  out.drawn = await page.evaluate(() => [...window.drawn]);
  // p50/p99 interpolated within the bucket: half of 10 requests in (1 ms, 2 ms] is 1.5 ms.
  out.p50 = await page.evaluate(() => percentile([0.001, 0.002], [0, 10, 0], 0.5));
  // A rate is two samples' difference over their server times; no rate from samples too close.
  out.rates = await page.evaluate(() => {
    const at = (ms, n) => ({ unix_ms: ms, requests: n, hits: 0, lookups: 0, status: [0, 0, 0, 0, 0], upstream_errors: 0, sent: 0, saved: 0, latency: [] });
    return [rates(at(1000, 10), at(3000, 30)).rps, rates(at(1000, 10), at(1100, 30))];
  });
  out.p99_inf = await page.evaluate(() => percentile([0.001, 0.002], [0, 1, 99], 0.99));
  // Tiles on one line each at 1400 px: none taller than the first.
  out.tile_heights = await page.$$eval(".tile:not(.hidden)", (ts) => ts.map((t) => t.getBoundingClientRect().height));
  // No image route: no image tiles.
  out.image_tiles = await page.$$eval(".images-tile:not(.hidden)", (ts) => ts.length);
  // ... and none of their lines cut short.
  out.tiles_cut = await page.$$eval(".tile:not(.hidden) .k, .tile:not(.hidden) .v, .tile:not(.hidden) .s", (es) => es.filter((e) => e.scrollWidth > e.clientWidth).map((e) => e.textContent));
  if (shots) await page.screenshot({ path: shots + "/dashboard-errors.png" });

  await page.click("#browse");
  const row = 'tr[data-key$="/page1"]';
  await page.waitForSelector(row);
  out.listed = await page.locator("#entries tr").count();
  await page.click(row + " button.purge");
  await page.waitForSelector(row, { state: "detached" });
  out.after_purge = await page.locator("#entries tr").count();
  out.note = await page.textContent("#entries-note");

  // The configuration editor.
  await page.waitForFunction(() => document.querySelector("#config-note").textContent !== "–");
  out.config_note = await page.textContent("#config-note");
  out.config_readonly = await page.$eval("#config-text", (t) => t.readOnly);
  if (!out.config_readonly) {
    const good = await page.$eval("#config-text", (t) => t.value);
    out.config_redacted = good.includes("<redacted>") && !good.includes(token);
    await page.fill("#config-text", good + "\n[cache]\nmax_size = \"lots\"\n");
    await page.click("#config-check");
    await page.waitForFunction(() => document.querySelector("#config-errors").textContent !== "");
    out.config_error = await page.textContent("#config-errors");
    if (shots) await page.screenshot({ path: shots + "/dashboard-config.png" });
    await page.fill("#config-text", good + "\n# edited from the dashboard\n");
    await page.click("#config-apply");
    await page.waitForFunction(() => document.querySelector("#config-note").textContent.startsWith("applied"));
    out.config_versions = await page.$$eval("#config-versions option", (os) => os.map((o) => o.value));
    // Back to the file as it was before.
    await page.selectOption("#config-versions", out.config_versions[1]);
    await page.click("#config-rollback");
    await page.waitForFunction(() => document.querySelector("#config-note").textContent.startsWith("rolled back"));
    out.config_after_rollback = await page.$eval("#config-text", (t) => t.value);
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
