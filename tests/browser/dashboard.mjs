// Drives larder's dashboard in headless Chromium (playwright-core with Debian's chromium):
// a wrong token is refused; the right one logs in; requests sent to larder move the counters;
// the cache browser lists an entry and purges it. Prints one JSON line of what it saw.
// Usage: node dashboard.mjs ADMIN_URL SITE_URL TOKEN SCREENSHOT_PATH
import { createRequire } from "node:module";
const require = createRequire(process.env.PLAYWRIGHT_DIR + "/");
const { chromium } = require("playwright-core");

const [admin, site, token, shot] = process.argv.slice(2);
const out = {};
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
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
  await page.waitForFunction(() => /^[1-9][0-9.]*% · /.test(document.querySelector("#bw-saved").textContent), null, { timeout: 10000 });
  out.bw_saved = await page.textContent("#bw-saved");
  out.bw_out = await page.textContent("#bw-out");
  out.pools = await page.textContent("#pools");
  await page.waitForFunction(() => document.querySelectorAll("#top tr td").length >= 3 * 3, null, { timeout: 10000 });
  out.top = await page.textContent("#top");

  await page.click("#browse");
  const row = 'tr[data-key$="/page1"]';
  await page.waitForSelector(row);
  out.listed = await page.locator("#entries tr").count();
  if (shot) await page.screenshot({ path: shot, fullPage: true });
  await page.click(row + " button.purge");
  await page.waitForSelector(row, { state: "detached" });
  out.after_purge = await page.locator("#entries tr").count();
  out.note = await page.textContent("#entries-note");
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
