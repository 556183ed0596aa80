// Drives the Tenant Insights page in headless Chromium through playwright-core and prints ONE JSON object of
// observations to stdout; the Rust test (tests/insights.rs) asserts on them. This script only waits for
// conditions; it judges nothing beyond failing when a wait times out.
//
// Inputs (environment): LEASE_PLAYWRIGHT_CORE (playwright-core's package directory), LEASE_CHROMIUM (default
// /usr/bin/chromium), INSIGHTS_BASE (the pod's base URL), INSIGHTS_ADMIN_A / INSIGHTS_USER_A / INSIGHTS_ADMIN_B
// (bearer tokens: A's ADMIN, A's non-admin, B's ADMIN), INSIGHTS_REVOKE (A's lease to revoke through the page),
// INSIGHTS_FORGE (A's lease B's admin tries to revoke), INSIGHTS_SCREENSHOT (the PNG to write).
"use strict";

const path = require("path");

function input(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

const { chromium } = require(path.resolve(input("LEASE_PLAYWRIGHT_CORE")));
const executablePath = process.env.LEASE_CHROMIUM || "/usr/bin/chromium";
const base = input("INSIGHTS_BASE");
const adminA = input("INSIGHTS_ADMIN_A");
const userA = input("INSIGHTS_USER_A");
const adminB = input("INSIGHTS_ADMIN_B");
const revokeToken = input("INSIGHTS_REVOKE");
const forgeToken = input("INSIGHTS_FORGE");
const screenshot = input("INSIGHTS_SCREENSHOT");

const WAIT_MS = 20000;
// Auto-refresh runs every 5 s: a second load must show within this bound.
const REFRESH_WAIT_MS = 15000;

const obs = { console: [], dialogs: [] };

/** What the page shows right now. */
function snapshot(page) {
  return page.evaluate(() => {
    const $ = (id) => document.getElementById(id);
    const visible = (id) => !!$(id) && $(id).getClientRects().length > 0;
    let stored = null;
    try {
      stored = sessionStorage.getItem("lease-insights-token");
    } catch {}
    return {
      state: document.body.dataset.state,
      refresh: document.body.dataset.refresh,
      url: location.href,
      tenant: $("tenant").textContent,
      error: $("error").textContent,
      notice: $("notice").textContent,
      updated: $("updated").textContent,
      tokens: [...document.querySelectorAll("#holders tbody tr[data-token]")].map((tr) => tr.dataset.token),
      // The visible text of each holder row's token cell and of each counter row.
      tokenCells: [...document.querySelectorAll("#holders tbody tr[data-token]")].map((tr) => tr.cells[0].innerText),
      revokeButtons: document.querySelectorAll("#holders tbody tr[data-token] button.revoke").length,
      counters: [...document.querySelectorAll("#counters tbody tr")].map((tr) => ({
        cells: [...tr.cells].map((c) => c.innerText),
        driftClass: tr.cells.length > 4 ? tr.cells[4].className : "",
      })),
      text: document.body.innerText,
      signInVisible: visible("sign-in-form"),
      signOutVisible: visible("sign-out"),
      autoRefreshChecked: $("auto-refresh").checked,
      storedToken: stored,
      localStorageKeys: localStorage.length,
      scrollWidth: document.documentElement.scrollWidth,
      clientWidth: document.documentElement.clientWidth,
      maxInflight: window.__insights ? window.__insights.max : null,
      loads: window.__insights ? window.__insights.loads : null,
    };
  });
}

async function newPage(context, label) {
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT_MS);
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") obs.console.push(`${label} ${m.type()}: ${m.text()}`);
  });
  page.on("pageerror", (e) => obs.console.push(`${label} pageerror: ${e}`));
  page.on("dialog", async (d) => {
    obs.dialogs.push({ page: label, type: d.type(), message: d.message() });
    await d.accept();
  });
  return page;
}

const settled = 'body[data-state="ready"], body[data-state="error"]';

async function signIn(page, token) {
  await page.fill("#token-input", token);
  await page.click("#sign-in");
  // Every sign-in starts from signed-out, so this waits for its own first load.
  await page.waitForSelector(settled);
  return snapshot(page);
}

async function signOut(page) {
  await page.click("#sign-out");
  await page.waitForSelector('body[data-state="signed-out"]');
  return snapshot(page);
}

async function main() {
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    timeout: 60000,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-dev-shm-usage",
    ],
  });
  try {
    obs.browserVersion = browser.version();
    // A laptop screen.
    const context = await browser.newContext({ viewport: { width: 1366, height: 768 } });
    // Counts the page's holder-list requests in flight (init scripts run outside the page's CSP): loads must never
    // overlap.
    await context.addInitScript(() => {
      const stats = { inflight: 0, max: 0, loads: 0 };
      window.__insights = stats;
      const original = window.fetch;
      window.fetch = async (...args) => {
        const leases = String(args[0]).endsWith("api/v1/insights/leases");
        if (leases) {
          stats.loads++;
          stats.max = Math.max(stats.max, ++stats.inflight);
        }
        try {
          return await original(...args);
        } finally {
          if (leases) stats.inflight--;
        }
      };
    });
    const page = await newPage(context, "main");

    // Signed out: the form, no data.
    const response = await page.goto(`${base}/insights`);
    obs.pageStatus = response.status();
    obs.csp = response.headers()["content-security-policy"] || null;
    await page.waitForSelector('body[data-state="signed-out"]');
    obs.initial = await snapshot(page);
    obs.tokenInputType = await page.getAttribute("#token-input", "type");

    // A's ADMIN signs in through the form.
    obs.adminA = await signIn(page, adminA);

    // Auto-refresh: a later load shows a new "updated" time, without a reload of the page.
    await page.evaluate(() => {
      window.__notReloaded = true;
    });
    const before = obs.adminA.updated;
    await page.waitForFunction(
      (b) => document.getElementById("updated").textContent !== b && document.body.dataset.state === "ready",
      before,
      { timeout: REFRESH_WAIT_MS },
    );
    obs.refreshed = await snapshot(page);
    obs.refreshedWithoutReload = await page.evaluate(() => window.__notReloaded === true);

    await page.screenshot({ path: screenshot, fullPage: true });

    // Revoke one of A's leases through its row's button (the confirm dialog is accepted).
    const revokeRow = `#holders tbody tr[data-token="${revokeToken}"]`;
    await page.click(`${revokeRow} button.revoke`);
    await page.waitForSelector(revokeRow, { state: "detached" });
    await page.waitForFunction(() => document.getElementById("notice").textContent !== "");
    await page.waitForSelector('body[data-state="ready"]');
    obs.afterRevoke = await snapshot(page);
    obs.signedOutA = await signOut(page);

    // A non-admin of A: refused, and the refresh stops.
    obs.userA = await signIn(page, userA);
    obs.signedOutUser = await signOut(page);

    // B's ADMIN: only B's leases; a forged revoke of A's lease with B's bearer, from the page.
    obs.adminB = await signIn(page, adminB);
    obs.forged = await page.evaluate(
      async ([t, bearer]) => {
        const r = await fetch(`api/v1/insights/leases/${encodeURIComponent(t)}/revoke`, {
          method: "POST",
          headers: { Authorization: `Bearer ${bearer}` },
        });
        return { status: r.status, body: await r.text() };
      },
      [forgeToken, adminB],
    );
    await signOut(page);

    // The fragment sign-in, in a new tab (its own sessionStorage): the token leaves the URL for sessionStorage, and
    // survives a reload of the tab.
    const tab = await newPage(context, "fragment");
    await tab.goto(`${base}/insights#token=${encodeURIComponent(adminA)}`);
    await tab.waitForSelector(settled);
    obs.fragment = await snapshot(tab);
    await tab.reload();
    await tab.waitForSelector(settled);
    obs.fragmentReloaded = await snapshot(tab);
  } finally {
    await browser.close();
  }
}

main().then(
  () => process.stdout.write(`${JSON.stringify(obs)}\n`),
  (e) => {
    // What was seen so far helps to tell where it stopped.
    process.stderr.write(`insights.cjs: ${e && e.stack ? e.stack : e}\nobservations so far: ${JSON.stringify(obs)}\n`);
    process.exit(1);
  },
);
