// Drives a push route in headless Chromium (playwright-core with Debian's chromium): the demo
// page connects with EventSource and shows a record written with curl-like fetches as it
// changes and goes; a WebSocket opened in the page subscribes with a filter and gets the
// changes that match. Prints one JSON line of what it saw.
// Usage: node push.mjs SITE_URL TOKEN
import { createRequire } from "node:module";
const require = createRequire(process.env.PLAYWRIGHT_DIR + "/");
const { chromium } = require("playwright-core");

const [site, token] = process.argv.slice(2);
const out = {};
const put = (id, value) => fetch(site + "/" + id, {
  method: "PUT", body: JSON.stringify(value),
  headers: { "authorization": "Bearer " + token, "content-type": "application/json" },
});
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  await put("cars/1", { color: "red", price: 42 });
  const page = await browser.newPage();
  await page.goto(site + "/");
  await page.waitForFunction(() => document.querySelector("#state").textContent === "live");
  const row = (id) => page.evaluate((id) => {
    for (const tr of document.querySelectorAll("#rows tr")) {
      if (tr.children[0].textContent === id) return tr.children[1].textContent;
    }
    return null;
  }, id);
  out.initial = await row("cars/1");
  await put("cars/1", { color: "blue", price: 40 });
  await page.waitForFunction(() => document.querySelector("#rows").textContent.includes("blue"));
  out.changed = await row("cars/1");
  await put("cars/2", { price: 7 });
  await page.waitForFunction(() => document.querySelectorAll("#rows tr").length === 2);
  out.rows = await page.evaluate(() => document.querySelectorAll("#rows tr").length);
  await fetch(site + "/cars/2", { method: "DELETE", headers: { "authorization": "Bearer " + token } });
  await page.waitForFunction(() => document.querySelectorAll("#rows tr").length === 1);
  out.after_delete = await page.evaluate(() => document.querySelectorAll("#rows tr").length);

  // A WebSocket from the page: subscribe to cheap cars, then two writes, one matching.
  const ws = page.evaluate((url) => new Promise((resolve, reject) => {
    const s = new WebSocket(url);
    const seen = [];
    s.onopen = () => s.send(JSON.stringify({ op: "subscribe", name: "cheap", match: "cars/*",
                                            filter: "price < 10", init: false }));
    s.onmessage = (m) => {
      const d = JSON.parse(m.data);
      seen.push(d);
      if (d.op === "subscribe") window.__subscribed = true;
      if (d.event === "set") { s.close(); resolve(seen); }
    };
    s.onerror = () => reject(new Error("websocket error"));
    setTimeout(() => reject(new Error("no event in 10 s: " + JSON.stringify(seen))), 10000);
  }), site.replace("http", "ws") + "/");
  await page.waitForFunction(() => window.__subscribed === true);
  await put("cars/3", { price: 500 });
  await put("cars/4", { price: 5 });
  out.ws = await ws;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
