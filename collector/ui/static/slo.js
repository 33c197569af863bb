// tokenpath UI: the SLO classes on the overview (/api/summary's "slo"): goodput, dollars
// per good request, and the dollars of requests that missed their objective, shown beside
// the three leaks and never added to them (a slow request may also be a leaking one).
"use strict";

const tpSlo = (() => {
  const { el, fmtDollars, fmtPct, fmtNum, DASH } = tp;

  const rate = (v) => (v === null || v === undefined ? DASH : fmtNum(v, 3));

  function stages(missedByStage) {
    const ranked = Object.entries(missedByStage || {}).sort((a, b) => b[1] - a[1]);
    return ranked.length ? ranked.map(([stage, n]) => `${stage} ${n}`).join(", ") : DASH;
  }

  // Two KPIs for the overview's row: goodput and dollars per good request.
  function kpis(slo, kpi) {
    if (!slo) return [];
    return [
      kpi("Goodput", `${rate(slo.goodput_requests_per_second)} req/s`,
          `met their SLO · ${rate(slo.goodput_per_gpu)} per GPU (${slo.gpus_billed} billed)`,
          "kpi-goodput"),
      kpi("$ per good request", fmtDollars(slo.dollars_per_good_request),
          `${fmtNum(slo.met)} of ${fmtNum(slo.requests)} requests met their SLO`,
          "kpi-good-request"),
    ];
  }

  // The card beside the three leaks.
  function missedCard(slo) {
    if (!slo) return null;
    return el("a", { class: "leak slo-missed", href: "#/", id: "leak-slo-missed" },
      el("div", { class: "leak-title", text: "Missed SLO" }),
      el("div", { class: "leak-value", text: fmtDollars(slo.missed_dollars) }),
      el("div", { class: "kpi-sub", text: `${fmtNum(slo.missed)} requests missed their `
        + "objective · overlaps the leaks: not added to them" }),
      el("div", { class: "kpi-sub", text: `dominant stage: ${stages(slo.missed_by_stage)}` }));
  }

  // One row per class.
  function classTable(slo, card, table, td) {
    if (!slo) return null;
    // objectives where the collector knows the classes (a store read alone does not)
    const objectives = slo.classes.some((c) => c.objective !== null);
    const rows = slo.classes.map((c) => el("tr", { "data-slo": c.slo },
      td(c.slo), objectives ? td(fmtPct(c.objective, 2), "num objective") : null,
      td(fmtNum(c.met), "num"), td(fmtNum(c.missed), "num"),
      td(fmtNum(c.unknown), "num"), td(fmtPct(c.attainment), "num"),
      td(rate(c.goodput_requests_per_second), "num goodput"),
      td(rate(c.goodput_per_gpu), "num"),
      td(fmtDollars(c.dollars_per_good_request), "num per-good"),
      td(fmtDollars(c.missed_dollars), "num missed"), td(stages(c.missed_by_stage))));
    return card("SLO classes",
      el("p", { class: "note", text: `Over ${fmtNum(slo.window_seconds, 1)} s and `
        + `${slo.gpus_billed} GPUs billed. Goodput: requests within their class's targets per `
        + "second; $ per good request: the class's dollars over its met requests." }),
      table("Goodput and dollars by SLO class", ["class",
        ...(objectives ? ["objective"] : []), "met", "missed", "unknown",
        "attainment", "goodput/s", "goodput/s/GPU", "$ per good request", "missed $",
        "missed: dominant stage"], rows, "data slo-table"));
  }

  // The chargeback table's SLO columns, per tenant.
  const TENANT_HEADERS = ["met SLO", "$ per good request", "missed-SLO $"];

  function tenantCells(row, td) {
    return [td(`${fmtNum(row.good_requests)} of ${fmtNum(row.slo_requests)}`, "num"),
      td(fmtDollars(row.dollars_per_good_request), "num per-good"),
      td(fmtDollars(row.missed_slo_dollars), "num missed")];
  }

  return { kpis, missedCard, classTable, TENANT_HEADERS, tenantCells };
})();
