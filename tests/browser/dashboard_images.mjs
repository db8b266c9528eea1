// The dashboard's image tiles in headless Chromium (playwright-core with Debian's chromium):
// after image transforms, a cached result and a missing original, the tiles show the
// transforms per second and in total, their p50 / p99, the queue and the originals by outcome.
// Prints one JSON line of what it saw.
// Usage: node dashboard_images.mjs ADMIN_URL SITE_URL TOKEN
import { createRequire } from "node:module";
const require = createRequire(process.env.PLAYWRIGHT_DIR + "/");
const { chromium } = require("playwright-core");

const [admin, site, token] = process.argv.slice(2);
const out = {};
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  await page.goto(admin + "/_larder/dashboard");
  await page.fill("#token", token);
  await page.click("#login");
  await page.waitForFunction(() => document.querySelector("#live").textContent === "live");
  for (const path of [
    "/insecure/rs:fit:60:60/plain/photo.jpg@webp",
    "/insecure/rs:fit:60:60/plain/photo.jpg@webp",
    "/unsafe/40x40/photo.jpg",
    "/insecure/rs:fit:60:60/plain/missing.jpg",
  ]) await (await fetch(site + path)).arrayBuffer();
  await page.waitForSelector("#img-rate-tile:not(.hidden)");
  await page.waitForFunction(() => document.querySelector("#img-total").textContent === "2", null, { timeout: 10000 });
  // Transforms between two ticks: the rate and the percentiles show.
  for (const w of [80, 90]) await (await fetch(site + `/insecure/rs:fit:${w}:${w}/plain/photo.jpg`)).arrayBuffer();
  await page.waitForFunction(() => document.querySelector("#img-total").textContent === "4" && Number(document.querySelector("#img-rate").textContent) > 0, null, { timeout: 10000 });
  for (const id of ["img-rate", "img-total", "img-lat", "img-queue", "img-rejected", "img-src"]) {
    out[id] = await page.textContent("#" + id);
  }
  out.tiles = await page.$$eval(".images-tile:not(.hidden)", (ts) => ts.length);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
