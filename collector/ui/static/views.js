// tokenpath UI views: overview, requests, request waterfall, cache & leaks, what-if.
// Each view fetches its data and returns a DOM node; app.js routes and polls.
"use strict";

(() => {
  const { el, fmtSeconds, fmtDollars, fmtPct, fmtNum, fmtTime, isNum, DASH } = tp;
  const { api, withWindow } = tpApp;

  const stageList = () => tpApp.loadStages();

  function provenanceBadge(provenance) {
    if (!provenance) return el("span", { class: "badge none", text: "not recorded" });
    return el("span", { class: `badge ${provenance}`, text: provenance,
                        title: provenance === "modeled"
                          ? "modeled: a documented roofline or apportionment model"
                          : provenance === "derived" ? "derived: arithmetic on measured values"
                            : "measured: a span or counter timed it" });
  }

  function kpi(label, value, sub, id) {
    return el("div", { class: "kpi", id },
      el("div", { class: "kpi-label", text: label }),
      el("div", { class: "kpi-value", text: value }),
      sub ? el("div", { class: "kpi-sub", text: sub }) : null);
  }

  function card(title, ...children) {
    return el("section", { class: "card", "aria-label": title }, el("h2", { text: title }),
              ...children);
  }

  function note(text) {
    return el("p", { class: "note", text });
  }

  function table(caption, headers, rows, cls) {
    return el("table", { class: cls || "" },
      el("caption", { text: caption }),
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, rows));
  }

  function td(content, cls) {
    return el("td", { class: cls || null }, content);
  }

  // --- overview ---------------------------------------------------------------------------

  // Which records this page shows: the ones this collector priced. A replica that forwards
  // what it maps shows only records other replicas forwarded to it.
  function scopeText(collector) {
    const forward = collector && collector.forward_records;
    return forward
      ? `records priced by this collector; those it maps are priced at ${forward}`
      : "records priced by this collector (merge replicas: tokenpath report --collector A,B)";
  }

  async function overview() {
    const [summary, leaks, series, stages, charge] = await Promise.all([
      api(withWindow("/api/summary")), api(withWindow("/api/leaks?limit=5")), api(withWindow("/api/timeseries?buckets=20")),
      stageList(), api(withWindow("/api/chargeback")),
    ]);
    const sloRows = charge.rows.some((r) => r.slo_requests > 0);  // SLO classes configured
    const tenantRows = charge.rows.map((r) => el("tr", { "data-tenant": r.tenant },
      td(r.tenant), td(fmtNum(r.requests), "num"), td(fmtDollars(r.cost_dollars), "num"),
      td(fmtDollars(r.idle_dollars), "num"), td(fmtDollars(r.total_dollars), "num"),
      sloRows ? tpSlo.tenantCells(r, td) : null));
    const byStage = Object.fromEntries(summary.stages.map((s) => [s.stage, s]));
    const anyCost = summary.cost_dollars > 0 || summary.idle_cost_dollars > 0;
    const modeledTag = summary.simulated ? " · simulated engine" : "";
    const root = el("div", { class: "page" },
      el("h1", { text: "Overview" }),
      el("p", { class: "lede",
                text: `${fmtNum(summary.requests)} requests over ${fmtSeconds(summary.window_seconds)}`
                  + ` · models: ${summary.models.join(", ") || DASH}${modeledTag}`
                  + ` · window: ${tpApp.timeWindow()}`
                  + ` · ${scopeText(summary.collector)}` }),
      el("div", { class: "kpis", id: "kpis" },
        kpi("Prefix-cache hit ratio", fmtPct(summary.prefix_cache_hit_ratio),
            `${fmtNum(summary.cache_read_tokens)} of ${fmtNum(summary.input_tokens)} input tokens`,
            "kpi-hit-ratio"),
        kpi("TTFT p50 / p95", fmtSeconds(summary.ttft_p50_seconds),
            `p95 ${fmtSeconds(summary.ttft_p95_seconds)} · time to first token`, "kpi-ttft"),
        kpi("Output tokens/s", fmtNum(summary.output_tokens_per_second, 1),
            `${fmtNum(summary.output_tokens)} output tokens`, "kpi-tps"),
        kpi("$ per 1M output tokens", anyCost
          ? fmtDollars(summary.cost_per_million_output_tokens) : DASH,
        anyCost ? "apportioned cost incl. idle · modeled" : "not priced yet", "kpi-cpm"),
        kpi("Cost", anyCost ? fmtDollars(summary.cost_dollars) : DASH, anyCost
          ? `naive wall-clock: ${fmtDollars(summary.naive_cost_dollars)}` : "not priced yet",
        "kpi-cost"),
        kpi("Idle cost", anyCost ? fmtDollars(summary.idle_cost_dollars) : DASH,
            "GPU time with no request", "kpi-idle"),
        kpi(`GPU energy${summary.energy_provenance ? ` (${summary.energy_provenance})` : ""}`,
            summary.energy_provenance ? `${fmtNum(summary.energy_joules / 3.6e6, 4)} kWh` : DASH,
            summary.energy_joules_per_output_token != null
              ? `${fmtNum(summary.energy_joules_per_output_token, 2)} J per output token · idle `
                + `${fmtNum(summary.idle_energy_joules / 3.6e6, 4)} kWh` : "not priced yet",
            "kpi-energy"),
        ...tpSlo.kpis(summary.slo, kpi)),
      el("h2", { class: "section", text: "The three money leaks" }),
      el("div", { class: summary.slo ? "leaks with-slo" : "leaks" }, leakCards(leaks),
         tpSlo.missedCard(summary.slo)),
      tpSlo.classTable(summary.slo, card, table, td),
      el("div", { class: "grid2" },
        card("$ by stage",
          anyCost ? null : note("No dollars recorded yet: the collector prices stages once a "
                                + "price sheet / cost model is configured."),
          !anyCost ? null : tp.barChart(stages.map((s) => ({
            label: `${s.order}. ${s.title}`,
            value: byStage[s.id] ? byStage[s.id].cost_dollars : 0,
            colour: tp.GROUP_COLOURS[s.group],
            note: byStage[s.id] && byStage[s.id].provenance === "modeled" ? "modeled" : "",
          })), { fmt: fmtDollars, title: "Dollars by stage, in path order" })),
        card("Latency by stage (p50)",
          tp.barChart(stages.map((s) => ({
            label: `${s.order}. ${s.title}`,
            value: byStage[s.id] ? byStage[s.id].p50_seconds : null,
            colour: tp.GROUP_COLOURS[s.group],
            note: byStage[s.id] && byStage[s.id].provenance === "modeled" ? "modeled" : "",
          })), { fmt: fmtSeconds, title: "p50 seconds by stage, in path order" }))),
      card("Prefix-cache hit ratio over time",
        tp.lineChart(series.points.map((p) => ({ t: p.start_unix, v: p.prefix_cache_hit_ratio })),
                     { fmtY: (v) => fmtPct(v, 0), yMax: 1, width: 1300, height: 200,
                       title: "Token-weighted hit ratio" })),
      card("Chargeback by tenant",
        note(`Attributed dollars plus idle GPU dollars (${charge.idle_policy}); the rows sum `
             + `to ${fmtDollars(charge.total_dollars)}. \`tokenpath chargeback\` exports them.`),
        tenantRows.length ? table("Dollars by tenant", ["tenant", "requests", "attributed",
          "idle", "total", ...(sloRows ? tpSlo.TENANT_HEADERS : [])], tenantRows,
        "data tenants-table") : note("No requests yet.")),
      groupLegend());
    return root;
  }
  overview.live = true;

  function leakCards(leaks) {
    const cache = leaks.cache;
    const longCtx = leaks.long_context;
    const mile = leaks.last_mile;
    const top = cache.top_prefixes[0];
    return [
      el("a", { class: "leak", href: "#/leaks", id: "leak-cache" },
        el("div", { class: "leak-title", text: "1 · Prefix-cache misses" }),
        leaks.priced
          ? el("div", { class: "leak-value", text: fmtDollars(cache.cache_miss_waste_dollars) })
          : el("div", { class: "leak-value", text: `${fmtNum(cache.recomputed_prefix_tokens)} tok` }),
        el("div", { class: "kpi-sub", text: (leaks.priced
          ? "wasted on recomputed prefixes" : "prefix tokens recomputed (not priced yet)")
          + ` · hit ratio ${fmtPct(cache.prefix_cache_hit_ratio)}` }),
        el("div", { class: "kpi-sub", text: top ? `top prefix ${top.fingerprint.slice(0, 10)}… `
          + `${fmtNum(top.prefix_tokens)} tokens × ${top.requests}` : "no repeated prefixes yet" })),
      el("a", { class: "leak", href: "#/leaks", id: "leak-long-context" },
        el("div", { class: "leak-title", text: "2 · Long contexts" }),
        el("div", { class: "leak-value", text: fmtPct(longCtx.share_of_requests) }),
        el("div", { class: "kpi-sub", text: `of requests ≥ ${fmtNum(longCtx.threshold_tokens)} `
          + "input tokens" }),
        el("div", { class: "kpi-sub", text: `their share of cost ${fmtPct(longCtx.share_of_cost)}`
          + ` · of prefill time ${fmtPct(longCtx.share_of_prefill_seconds)}` })),
      el("a", { class: "leak", href: "#/leaks", id: "leak-small-packets" },
        el("div", { class: "leak-title", text: "3 · Last mile" }),
        el("div", { class: "leak-value", text: `${fmtNum(mile.packets_per_output_token, 2)}` }),
        el("div", { class: "kpi-sub", text: "packets per output token · "
          + `${fmtNum(mile.wire_bytes_per_payload_byte, 2)} wire bytes per payload byte` }),
        el("div", { class: "kpi-sub", text: `${fmtNum(mile.leaking_streams)} of `
          + `${fmtNum(mile.streams)} streams write a packet per 1-2 tokens` })),
    ];
  }

  function groupLegend() {
    return el("p", { class: "legend" }, Object.entries(tp.GROUP_COLOURS).map(([group, c]) =>
      el("span", {}, el("i", { style: `background:${c}` }), group)),
      el("span", {}, el("i", { class: "hatch" }), "modeled"));
  }

  // --- requests ---------------------------------------------------------------------------

  const priced = (r) => r.cost_dollars > 0 || r.naive_cost_dollars > 0;

  async function requests() {
    const records = await api(withWindow("/api/requests?limit=200"));
    const rows = records.map((r) => el("tr", {},
      td(fmtTime(r.end_unix)),
      td(el("a", { href: `#/requests/${r.record_id || r.trace_id}`, class: "mono",
                   "aria-label": `Request ${r.trace_id}` }, r.trace_id.slice(0, 16) + "…")),
      td(r.model), td(fmtNum(r.input_tokens), "num"), td(fmtNum(r.cache_read_tokens), "num"),
      td(fmtNum(r.output_tokens), "num"), td(fmtSeconds(r.ttft_seconds), "num"),
      td(fmtSeconds(r.duration_seconds), "num"),
      td(priced(r) ? fmtDollars(r.cost_dollars) : DASH, "num"),
      td(priced(r) ? fmtDollars(r.naive_cost_dollars) : DASH, "num"),
      td(r.complete ? "yes" : el("span", { class: "badge warn", text: "partial" }))));
    return el("div", { class: "page" },
      el("h1", { text: "Requests" }),
      el("p", { class: "lede", text: `${records.length} most recent requests, newest first. `
        + "Open one for its 15-stage waterfall." }),
      records.length ? table("Recent requests", ["ended", "trace id", "model", "input",
        "cached", "output", "TTFT", "duration", "cost", "naive cost", "complete"], rows,
      "data requests-table") : note("No requests recorded yet."));
  }
  requests.live = true;

  // --- one request: the waterfall ----------------------------------------------------------

  async function request(route) {
    const [r, stages] = await Promise.all([
      api(`/api/requests/${encodeURIComponent(route.traceId)}`), stageList()]);
    const isPriced = priced(r); // an unpriced record shows dashes, never $0
    // a disaggregated request: each phase's GPU time was paid by its own engine's GPUs
    const PHASES = ["prefill", "decode", "kv_transfer"];
    const disaggregated = r.kv_transfer_source != null;
    const engineOf = disaggregated
      ? { prefill: r.prefill_engine_id, decode: r.decode_engine_id } : {};
    const total = stages.reduce((s, st) => s + (r.stages[st.id] ? r.stages[st.id].seconds : 0), 0);
    let offset = 0;
    const rows = stages.map((st) => {
      const t = r.stages[st.id];
      const seconds = t ? t.seconds : 0;
      const phases = t && t.phases ? t.phases : null;
      const segments = phases
        ? PHASES.filter((p) => phases[p])
          .map((p) => ({ w: phases[p].seconds, colour: tp.PHASE_COLOURS[p] }))
        : [];
      const phased = segments.reduce((sum, seg) => sum + seg.w, 0);
      if (seconds - phased > 1e-12) { // time recorded without a phase
        segments.push({ w: seconds - phased, colour: tp.GROUP_COLOURS[st.group] });
      }
      const bar = tp.waterfallBar(offset, t ? segments : [], total, {
        modeled: t && t.provenance === "modeled",
        label: `${st.title}: ${fmtSeconds(seconds)} starting at ${fmtSeconds(offset)}`,
      });
      offset += seconds;
      const phaseText = phases ? PHASES.filter((p) => phases[p])
        .map((p) => `${p}${engineOf[p] ? ` (${engineOf[p]})` : ""} `
          + fmtSeconds(phases[p].seconds)
          + (isPriced ? ` / ${fmtDollars(phases[p].cost_dollars)}` : ""))
        .join(" · ") : "";
      return el("tr", { class: t ? "stage-row" : "stage-row missing", "data-stage": st.id },
        td(String(st.order), "num"),
        el("th", { scope: "row" }, el("span", { class: "swatch",
          style: `background:${tp.GROUP_COLOURS[st.group]}` }), st.title,
        el("div", { class: "sub", text: `${st.id} · bound by ${st.bound_by}` })),
        td(bar, "bar"), td(t ? fmtSeconds(seconds) : DASH, "num"),
        td(t && isPriced ? fmtDollars(t.cost_dollars) : DASH, "num"),
        td(t ? provenanceBadge(t.provenance) : provenanceBadge(null)), td(phaseText, "sub"));
    });
    const gpuCost = stages.filter((s) => s.gpu && r.stages[s.id])
      .reduce((sum, s) => sum + r.stages[s.id].cost_dollars, 0);
    const naiveRatio = r.cost_dollars > 0 ? r.naive_cost_dollars / r.cost_dollars : null;
    return el("div", { class: "page" },
      el("p", {}, el("a", { href: "#/requests", text: "← All requests" })),
      el("h1", { text: "Request " }, el("span", { class: "mono", text: r.record_id || r.trace_id })),
      el("p", { class: "lede", text: [r.model, r.node && `node ${r.node}`,
        r.gpu_type && `${r.gpu_type} × ${r.tensor_parallel}`, r.engine && `engine ${r.engine}`,
        r.simulated ? "simulated" : null, r.complete ? null : "partial trace",
        r.slo && `SLO ${r.slo}: ${r.slo_outcome}`
          + (r.slo_miss_stage ? ` (mostly ${r.slo_miss_stage})` : "")]
        .filter(Boolean).join(" · ") }),
      el("div", { class: "kpis" },
        kpi("Input tokens", fmtNum(r.input_tokens), `${fmtNum(r.cache_read_tokens)} cached `
            + `(${fmtPct(r.input_tokens ? r.cache_read_tokens / r.input_tokens : null)})`,
            "kpi-input"),
        kpi("Output tokens", fmtNum(r.output_tokens), `TPOT ${fmtSeconds(r.tpot_seconds)}`),
        kpi("TTFT", fmtSeconds(r.ttft_seconds), `queue ${fmtSeconds(r.queue_seconds)}`),
        kpi("Duration", fmtSeconds(r.duration_seconds), `${r.span_count} spans`),
        kpi("Cost (apportioned)", isPriced ? fmtDollars(r.cost_dollars) : DASH,
            isPriced ? `GPU ${fmtDollars(gpuCost)}` : "not priced", "kpi-cost"),
        kpi("Naive wall-clock cost", isPriced ? fmtDollars(r.naive_cost_dollars) : DASH, naiveRatio
          ? `${naiveRatio.toFixed(1)}× the apportioned cost` : "duration × $/s, for comparison",
        "kpi-naive")),
      card("Prefill vs decode",
        tp.stackedBar([
          { label: "prefill", value: r.prefill_seconds || 0, colour: tp.PHASE_COLOURS.prefill },
          { label: "decode", value: r.decode_seconds || 0, colour: tp.PHASE_COLOURS.decode },
        ], { fmt: fmtSeconds, title: "Engine in-model seconds: prefill versus decode" }),
        r.cache_miss_waste_dollars > 0 ? note(`Prefix-cache miss waste on this request: `
          + `${fmtDollars(r.cache_miss_waste_dollars)}`) : null),
      disaggregated ? el("section", { class: "card", "aria-label": "Disaggregated serving",
        id: "disaggregated" },
        el("h2", { text: "Two engines: prefill, the KV transfer, decode" }),
        note(`Prefill on ${r.prefill_engine_id || "an unnamed engine"}`
          + (r.prefill_node ? ` (node ${r.prefill_node})` : "")
          + `, decode on ${r.decode_engine_id || "an unnamed engine"}`
          + (r.decode_node ? ` (node ${r.decode_node})` : "")
          + `. KV transfer: ${fmtNum(r.kv_transfer_tokens)} tokens (${r.kv_transfer_source}), `
          + `${fmtNum(r.kv_transfer_bytes)} bytes (modeled). Each GPU stage's prefill share `
          + "was paid by the prefill engine's GPUs, its decode share by the decode engine's."))
        : null,
      el("section", { class: "card", "aria-label": "Waterfall" },
        el("h2", { text: "Waterfall: the 15 stages in path order" }),
        note("Bars are laid end to end in path order; width is the stage's time. GPU stages "
             + "split the engine's measured in-model time into prefill and decode; hatched "
             + "bars are modeled, not measured."),
        table("Stages of this request", ["#", "stage", "time line", "seconds", "dollars",
          "provenance", "phases"], rows, "data waterfall"),
        el("p", { class: "legend" },
          el("span", {}, el("i", { style: `background:${tp.PHASE_COLOURS.prefill}` }), "prefill"),
          el("span", {}, el("i", { style: `background:${tp.PHASE_COLOURS.decode}` }), "decode"),
          el("span", {}, el("i", { style: `background:${tp.PHASE_COLOURS.kv_transfer}` }),
            "KV transfer"),
          el("span", {}, el("i", { class: "hatch" }), "modeled"))));
  }

  // --- cache & leaks ----------------------------------------------------------------------

  async function leaks() {
    const [data, series] = await Promise.all([
      api(withWindow("/api/leaks?limit=15")), api(withWindow("/api/timeseries?buckets=30"))]);
    const cache = data.cache;
    const money = (v) => (data.priced ? fmtDollars(v) : DASH);
    const prefixRows = cache.top_prefixes.map((p) => el("tr", {},
      td(el("code", { title: p.fingerprint, text: p.fingerprint.slice(0, 16) })),
      td(fmtNum(p.prefix_tokens), "num"), td(fmtNum(p.requests), "num"),
      td(fmtNum(p.hits), "num"), td(fmtNum(p.misses), "num"),
      td(fmtNum(p.recomputed_tokens), "num"), td(money(p.waste_dollars), "num")));
    const causeRows = Object.entries(cache.by_cause).map(([cause, c]) => el("tr", {},
      td(el("code", { text: cause })), td(fmtNum(c.tokens), "num"), td(money(c.dollars), "num"),
      td(c.waste ? "waste" : "first prefill"), td(c.fix)));
    // Measured by the engines: their KV-cache events, counted by the node agents.
    const measured = cache.measured || [];
    const measuredRows = measured.map((m) => el("tr", { "data-cause": m.cause },
      td(m.node), td(el("code", { text: m.engine })), td(m.model),
      td(el("code", { text: m.cause })), td(fmtNum(m.tokens), "num"),
      td(m.tokens_per_second == null ? DASH : fmtNum(m.tokens_per_second), "num"),
      td(m.dollars_per_hour == null ? DASH : fmtDollars(m.dollars_per_hour), "num")));
    // How far the two agree: each side's share of its recomputed tokens by cause.
    const shares = (pairs) => {
      const total = pairs.reduce((sum, [, v]) => sum + v, 0);
      const out = {};
      for (const [cause, v] of pairs) out[cause] = (out[cause] || 0) + v;
      return Object.entries(out).map(([cause, v]) =>
        `${cause} ${total > 0 ? fmtPct(v / total, 0) : DASH}`).join(", ");
    };
    const measuredPart = !measured.length
      ? note("Measured: no node agent sends the engines' KV-cache events to this collector "
             + "(`tokenpath agent --kv-events`), so only the inferred causes are shown.")
      : el("div", { id: "measured-causes" },
        note("Measured by the engines: full KV blocks each engine stored without holding "
             + "them, from its KV-cache events (evicted: it had removed the block; routed: "
             + "another engine of the model on that node held it; cold). Counted since "
             + "each agent started; routed is per node there, fleet-wide above. Dollars: "
             + "tokens/s at the window's prefill dollars per computed prompt token."),
        el("p", { class: "note cap", id: "causes-agreement", text:
          `Shares of recomputed tokens: measured ${shares(measured.map((m) =>
            [m.cause, m.tokens]))}; inferred ${shares(Object.entries(cache.by_cause).map(
            ([cause, c]) => [cause, c.tokens]))}.` }),
        table("Measured by the engines' KV-cache events", ["node", "engine", "model", "cause",
          "tokens", "tokens/s", "$/h"], measuredRows, "data measured-causes-table"));
    const longCtx = data.long_context;
    const small = data.small_packets;
    const mile = data.last_mile;
    const rankRows = data.ranked.map((l, i) => el("tr", { "data-leak": l.leak },
      td(String(i + 1), "num"), td(l.leak.replaceAll("_", " ")), td(money(l.dollars), "num"),
      td(l.fix), td(money(l.saving_dollars), "num"), td(l.saving)));
    const coalesceRows = mile.coalescing_whatif.map((c) => el("tr", {},
      td(fmtNum(c.tokens_per_write), "num"), td(fmtNum(c.packets_per_output_token, 3), "num"),
      td(fmtNum(c.wire_bytes_per_payload_byte, 2), "num")));
    // Per node: its physical NICs, and its loopback apart (a single-machine demo's traffic
    // is all on lo). A NIC that sent nothing says so instead of showing 0 and a dash.
    const devicesText = (names, fallback) => (names && names.length ? names.join(", ") : fallback);
    const nodeRows = mile.nodes.flatMap((n) => {
      const physical = n.transmit_packets_per_second > 0
        ? el("tr", { "data-node": n.node, "data-devices": "physical" }, td(n.node),
          td(`physical: ${devicesText(n.devices, "none reported")}`),
          td(fmtNum(n.transmit_packets_per_second), "num"),
          td(fmtNum(n.average_packet_bytes), "num"))
        : el("tr", { "data-node": n.node, "data-devices": "physical", class: "empty" },
          td(n.node), td(`physical: ${devicesText(n.devices, "none reported")}`),
          el("td", { colspan: "2", class: "no-data",
                     text: "no packets sent between the agent's last two samples" }));
      const loopback = n.loopback_packets_per_second > 0
        ? el("tr", { "data-node": n.node, "data-devices": "loopback" }, td(n.node),
          td(`loopback: ${devicesText(n.loopback_devices, "lo")} (never leaves the machine)`),
          td(fmtNum(n.loopback_packets_per_second), "num"),
          td(fmtNum(n.loopback_average_packet_bytes), "num"))
        : null;
      return loopback ? [physical, loopback] : [physical];
    });
    const onlyLoopback = mile.nodes.length > 0 && mile.nodes.every((n) =>
      !(n.transmit_packets_per_second > 0) && n.loopback_packets_per_second > 0);
    const nicPart = !mile.nodes.length
      ? note("Per node: no agent pushes NIC counters to this collector (`tokenpath agent` "
             + "on each node sends them), so there are no per-node packet figures.")
      : el("div", { id: "nic-part" },
        onlyLoopback ? el("p", { class: "note cap", id: "nic-loopback-note",
          text: "The traffic here is on loopback (as in `tokenpath demo`, where client, "
            + "gateway and engines share one machine): the physical NICs carried none of it, "
            + "so their counters say nothing about a real last mile." }) : null,
        table("Per node (the agent's NIC counters, between its last two samples)", ["node",
          "devices", "packets/s", "average packet bytes"], nodeRows, "data nic-table"));
    return el("div", { class: "page" },
      el("h1", { text: "Cache & leaks" }),
      card("The leaks, ranked by dollars",
        note("Each with its fix and what the fix would save (modeled)."),
        rankRows.length ? table("Leaks ranked", ["#", "leak", "dollars", "fix", "would save",
          "how"], rankRows, "data ranked-table") : note("No requests yet.")),
      el("div", { class: "kpis" },
        kpi("Prefix-cache hit ratio", fmtPct(cache.prefix_cache_hit_ratio), "token-weighted"),
        data.priced
          ? kpi("Miss waste", fmtDollars(cache.cache_miss_waste_dollars),
                "prefill re-run for recently seen prefixes", "kpi-waste")
          : kpi("Recomputed prefix tokens", fmtNum(cache.recomputed_prefix_tokens),
                "prefill re-run for recently seen prefixes (not priced yet)", "kpi-waste"),
        kpi("Long-context share", fmtPct(longCtx.share_of_requests),
            `requests ≥ ${fmtNum(longCtx.threshold_tokens)} tokens`, "kpi-long-context"),
        kpi("Small-packet share", fmtPct(small.share),
            `mean chunk ${fmtNum(small.mean_chunk_bytes)} bytes`, "kpi-small-packets")),
      card("Hit ratio over time",
        tp.lineChart(series.points.map((p) => ({ t: p.start_unix, v: p.prefix_cache_hit_ratio })),
                     { fmtY: (v) => fmtPct(v, 0), yMax: 1, width: 1300,
                       title: "Token-weighted prefix-cache hit ratio per interval" })),
      card("Why prefixes missed",
        note("Each recomputed prefix block by cause: seen on this engine (evicted), only on "
             + "another (routed elsewhere), within one block of the cache hit (sub-block), "
             + "or never seen (cold: its first prefill, not waste)."),
        table("Misses by cause", ["cause", "tokens", "dollars", "kind", "fix"], causeRows,
              "data causes-table"),
        measuredPart),
      card("Top repeated prefixes by waste",
        note("Salted fingerprints and lengths only: prompt content never reaches the "
             + `collector. Computed from ${cache.source}; `
             + `${(cache.block_tokens_used.length ? cache.block_tokens_used
               : [cache.block_tokens]).join(" or ")} tokens per block.`),
        prefixRows.length ? table("Repeated prefixes", ["fingerprint", "prefix tokens",
          "requests", "hits", "misses", "recomputed tokens", "waste"], prefixRows,
        "data prefixes-table") : note("No prefix seen twice yet.")),
      el("div", { class: "grid2" },
        card("Long contexts (attention grows as n²)",
          tp.barChart(longCtx.histogram.map((b) => ({ label: `${b.label} tokens`,
            value: b.requests, colour: b.min_tokens >= longCtx.threshold_tokens
              ? "#b91c1c" : "#2563eb" })), { fmt: (v) => `${fmtNum(v)} req`,
            title: "Requests by input length", width: 460 }),
          note(`≥ ${fmtNum(longCtx.threshold_tokens)} tokens: ${fmtPct(longCtx.share_of_requests)}`
            + ` of requests, ${fmtPct(longCtx.share_of_cost)} of cost, `
            + `${fmtPct(longCtx.share_of_prefill_seconds)} of prefill time.`)),
        card("Last-mile serialization",
          el("dl", { class: "facts" },
            el("dt", { text: "packets per output token" }),
            el("dd", { id: "last-mile-ppt", text: fmtNum(mile.packets_per_output_token, 3) }),
            el("dt", { text: "wire bytes per payload byte" }),
            el("dd", { text: fmtNum(mile.wire_bytes_per_payload_byte, 2) }),
            el("dt", { text: "leaking streams" }),
            el("dd", { text: `${fmtNum(mile.leaking_streams)} of ${fmtNum(mile.streams)} `
              + `(≥ ${mile.threshold_packets_per_token} packets per token)` }),
            el("dt", { text: "small chunks" }),
            el("dd", { text: `${fmtNum(small.small_chunks)} of ${fmtNum(small.response_chunks)} `
              + `(${fmtPct(small.share)})` }),
            el("dt", { text: "mean chunk size" }),
            el("dd", { text: `${fmtNum(small.mean_chunk_bytes)} bytes` }),
            el("dt", { text: "response path share of stage time" }),
            el("dd", { text: fmtPct(small.response_path_share_of_latency) }),
            el("dt", { text: "response path cost" }),
            el("dd", { text: money(small.response_path_cost_dollars) })),
          note("Streaming one token per tiny packet makes the network, not the GPU, the "
               + "latency floor."),
          mile.streams ? table("Coalescing what-if (modeled)", ["tokens per write",
            "packets per token", "wire bytes per payload byte"], coalesceRows,
          "data coalesce-table") : note("Coalescing what-if: no streamed response in this "
            + "window to model it on."),
          nicPart)));
  }
  leaks.live = true;

  // --- what-if ---------------------------------------------------------------------------
  // GET /api/whatif answers the page's opening projections in one read of the window; the
  // form (POST /api/whatif) refines them over the same window (its `until` kept).
  // Units: ratios change in percentage points (pp), dollars, throughput and latency relatively.

  const PROJECTION_METRICS = [
    // [label, key, format, better (+1 higher is better), unit of its change]
    ["$ per 1M output tokens", "cost_per_million_output_tokens", fmtDollars, -1, "relative"],
    ["Requests/s per GPU", "requests_per_second_per_gpu", (v) => fmtNum(v, 3), 1, "relative"],
    ["TTFT p50", "ttft_p50_seconds", fmtSeconds, -1, "relative"],
    ["Goodput/s per GPU", "goodput_per_gpu", (v) => fmtNum(v, 3), 1, "relative"],
    ["$ per good request", "dollars_per_good_request", fmtDollars, -1, "relative"],
    ["Prefix-cache hit ratio", "prefix_cache_hit_ratio", (v) => fmtPct(v), 1, "pp"],
    ["GPU utilization", "gpu_utilization", (v) => fmtPct(v), 1, "pp"],
  ];

  const signed = (v, digits = 1) => `${v > 0 ? "+" : v < 0 ? "−" : "±"}${Math.abs(v).toFixed(digits)}`;
  const fmtPp = (points) => (isNum(points) ? `${signed(points)} pp` : DASH);
  const fixed = (v, digits = 2) => (isNum(v) ? v.toFixed(digits) : DASH);
  const fmtRel = (rel) => (isNum(rel) ? `${signed(rel * 100)}% relative` : DASH);

  function field(id, label, input, hint) {
    return el("div", { class: "field" }, el("label", { for: id, text: label }), input,
              hint ? el("div", { class: "hint", id: `${id}-hint`, text: hint }) : null);
  }

  // The hit-ratio change in words: asked, applied and what the window's repeats allow.
  function cacheText(limit) {
    if (!limit || !isNum(limit.asked_delta) || limit.asked_delta === 0) return null;
    const asked = fmtPp(limit.asked_delta * 100);
    const possible = fmtPp(limit.possible_delta * 100);
    const repeat = `${fmtPct(limit.cacheable_hit_ratio)} of prompt tokens repeat an earlier `
      + "prefix in this window";
    return limit.capped
      ? `${asked} asked, ${possible} possible: only ${repeat}.`
      : `${asked} asked and applied; up to ${possible} possible (${repeat}).`;
  }

  function projectionTable(out, caption) {
    const rows = PROJECTION_METRICS.filter(([, key]) => key in out.baseline).map(
      ([label, key, fmt, better, unit]) => {
        const a = out.baseline[key];
        const b = out.projected[key];
        const change = unit === "pp" ? out.change_pp[key] : out.change[key];
        const good = !isNum(change) || Math.abs(change) < 1e-9 ? ""
          : (change * better > 0 ? "good" : "bad");
        return el("tr", { "data-metric": key, "data-unit": unit },
          el("th", { scope: "row", text: label }),
          td(fmt(a), "num baseline"), td(fmt(b), "num projected"),
          td(unit === "pp" ? fmtPp(change) : fmtRel(change), `num change ${good}`));
      });
    const limit = cacheText(out.cache_hit_rate);
    return el("div", {},
      table(caption, ["metric", "baseline", "projected", "change"], rows, "data whatif-table"),
      limit ? el("p", { class: out.cache_hit_rate.capped ? "note cap capped" : "note cap",
                        text: `Hit ratio: ${limit}` }) : null);
  }

  function cliLine(flags) {
    return `tokenpath whatif --collector ${location.origin} ${flags.join(" ")} --format json`;
  }

  function routingCard(s, windowFlags) {
    const head = el("h2", {}, `${s.title} `, provenanceBadge("modeled"));
    if (s.unavailable) {
      return el("section", { class: "card scenario", id: "scenario-prefix_affine", "aria-label": s.title },
        head, note(`Not projected: ${s.unavailable}.`));
    }
    const r = s.routing;
    const gain = isNum(r.hit_ratio_gain) ? r.hit_ratio_gain * 100 : null;
    return el("section", { class: "card scenario", id: "scenario-prefix_affine", "aria-label": s.title,
                           "data-scenario": s.id },
      head,
      note("What sending each request to the engine that already holds its prefix would "
           + "have done over this window."),
      r.engines < 2 ? el("p", { class: "note cap capped", id: "wi-routing-one-engine",
        text: `Only ${fmtNum(r.engines)} engine served this window: a router has nothing to `
          + "choose between, so the projection equals the baseline." }) : null,
      el("div", { class: "kpis" },
        kpi("Prefix-cache hit ratio", `${fmtPct(r.recorded_hit_ratio)} → `
            + `${fmtPct(r.predicted_hit_ratio)}`, `${fmtPp(gain)} (percentage points)`,
        "wi-routing-hit"),
        kpi("Prefill tokens saved", fmtNum(r.prefill_tokens_saved),
            "prompt tokens read from cache instead of computed", "wi-routing-tokens"),
        kpi("Prefill dollars saved", fmtDollars(r.prefill_dollars_saved),
            "each request's prefill $ per computed token", "wi-routing-dollars"),
        kpi("Load skew (busiest engine / mean)", `${fixed(r.load_skew_recorded)} → `
            + `${fixed(r.load_skew_predicted)}`,
            `${fmtNum(r.engines)} engine${r.engines === 1 ? "" : "s"}; a real router caps `
            + "it, giving back part of the gain",
            "wi-routing-skew")),
      projectionTable(s, "Baseline and projected figures with the router"),
      note(`Calibrated on ${s.calibrated_on}.`),
      el("p", { class: "note cli" }, "Same numbers: ",
         el("code", { text: cliLine([...windowFlags, ...s.cli_flags]) })));
  }

  function scenarioCard(s, windowFlags, refine) {
    const head = el("h2", {}, `${s.title} `, provenanceBadge("modeled"));
    const body = s.unavailable ? [note(`Not projected: ${s.unavailable}.`)] : [
      projectionTable(s, `${s.title}: baseline and projected`),
      el("details", { class: "calibrated" }, el("summary", { text: "Calibrated on" }),
         el("p", { class: "note", text: `${s.calibrated_on}.` })),
      el("p", { class: "note cli" }, el("code", { text: cliLine([...windowFlags,
        ...s.cli_flags]) })),
      el("div", { class: "actions" }, el("button", { type: "button", class: "secondary",
        text: "Refine in the form", onclick: () => refine(s.request) }))];
    return el("section", { class: "card scenario", id: `scenario-${s.id}`, "aria-label": s.title,
                           "data-scenario": s.id }, head, ...body);
  }

  async function whatif() {
    const data = await api(withWindow("/api/whatif"));
    const w = data.window;
    const windowFlags = data.cli_flags;
    const until = new Date(w.until_unix * 1000).toLocaleString("sv-SE"); // 2025-01-31 14:05:09
    const span = w.since ? `the ${w.since} before ${until}` : `all the store holds up to ${until}`;
    const lede = el("p", { class: "lede", id: "whatif-window", "data-since": w.since || "",
      "data-until": String(w.until_unix),
      text: `${fmtNum(w.records)} requests ended in ${span}. Every figure here is modeled `
        + "(the roofline of docs/cost-model.md): ratios change in percentage points (pp), "
        + "dollars, throughput and latency relatively." });
    const page = el("div", { class: "page" }, el("h1", { text: "What-if" }), lede);
    if (data.unavailable) {
      page.append(el("section", { class: "card", id: "whatif-unavailable" },
        el("h2", { text: "Nothing to project yet" }),
        note(`${data.unavailable}: the what-if model calibrates on the window's complete `
             + "requests. Pick a longer window or send traffic.")));
      return page;
    }
    const cal = data.calibration;
    const baseHit = data.baseline.prefix_cache_hit_ratio;
    const possiblePp = (cal.cacheable_hit_ratio - baseHit) * 100;
    const result = el("div", { id: "whatif-result", "aria-live": "polite" },
      el("section", { class: "card" }, el("h2", { text: "Your scenario" }),
         note("Combine changes in the form and press Project: the projection appears here, "
              + "over the same window as the figures above.")));
    const cacheHint = () => {
      const input = document.getElementById("wi-cache");
      const limit = `at most ${fmtPp(possiblePp)} possible, as only `
        + `${fmtPct(cal.cacheable_hit_ratio)} of prompt tokens repeat an earlier prefix`;
      if (input && input.value.trim() === "") {
        return `empty: no change (with the prefix-affine router, its replayed hits); ${limit}`;
      }
      const pp = input ? Number(input.value) : 10;
      const target = isNum(pp) ? baseHit + pp / 100 : null;
      return `percentage points of prompt tokens: ${fmtPp(pp)} takes ${fmtPct(baseHit)} to `
        + `${fmtPct(target)} asked; ${limit}`;
    };
    const cacheInput = el("input", { id: "wi-cache", name: "cache_hit_rate_pp", type: "number",
      step: "0.5", min: "-100", max: "100", value: "10", "aria-describedby": "wi-cache-hint" });
    const form = el("form", { id: "whatif-form", class: "card form" },
      el("h2", { text: "Refine" }),
      field("wi-router", "Router", el("select", { id: "wi-router", name: "router" },
        el("option", { value: "as_recorded", text: "as recorded" }),
        el("option", { value: "prefix_affine", text: "prefix-affine (replayed)" })),
      "prefix-affine takes its replayed hits unless a hit-ratio change is given"),
      field("wi-cache", "Prefix-cache hit ratio change (pp)", cacheInput, cacheHint()),
      field("wi-spec", "Speculative-decoding speedup (× decode)", el("input", { id: "wi-spec",
        name: "spec_decode_speedup", type: "number", step: "0.1", min: "1", max: "10",
        value: "1.0", "aria-describedby": "wi-spec-hint" }), "decode throughput ×, 1 = off"),
      field("wi-util", "GPU utilization (%)", el("input", { id: "wi-util",
        name: "gpu_utilization_pct", type: "number", step: "1", min: "5", max: "100",
        placeholder: `as recorded: ${fmtPct(cal.gpu_utilization)}`,
        "aria-describedby": "wi-util-hint" }), "5 to 100; empty = as recorded"),
      field("wi-quant", "Weight and KV-cache quantization", el("select", { id: "wi-quant",
        name: "quantization" }, ["none", "int8", "int4"].map((q) =>
        el("option", { value: q, text: q })))),
      el("div", { class: "actions" }, el("button", { type: "submit", class: "primary",
        id: "wi-submit", text: "Project" })));
    cacheInput.addEventListener("input", () => {
      document.getElementById("wi-cache-hint").textContent = cacheHint();
    });
    const refine = (request) => {
      form.reset();
      document.getElementById("wi-cache").value = isNum(request.cache_hit_rate_delta)
        ? String(Math.round(request.cache_hit_rate_delta * 1e5) / 1e3) : (request.router ? "" : "0");
      if (request.spec_decode_speedup) document.getElementById("wi-spec").value = String(request.spec_decode_speedup);
      if (request.quantization) document.getElementById("wi-quant").value = request.quantization;
      if (request.router) document.getElementById("wi-router").value = request.router;
      document.getElementById("wi-cache-hint").textContent = cacheHint();
      document.getElementById("wi-cache").focus();
    };
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const fields = new FormData(form);
      const body = {};
      for (const [key, value] of fields.entries()) {
        if (value === "") continue;
        if (key === "cache_hit_rate_pp") body.cache_hit_rate_delta = Number(value) / 100;
        else if (key === "gpu_utilization_pct") body.gpu_utilization = Number(value) / 100;
        else if (key === "quantization" || key === "router") body[key] = value;
        else body[key] = Number(value);
      }
      const params = new URLSearchParams({ until: String(w.until_unix) });
      if (w.since) params.set("since", w.since);
      result.replaceChildren(note("Projecting…"));
      try {
        result.replaceChildren(renderProjection(await api(`/api/whatif?${params}`,
          { method: "POST", body })));
      } catch (error) {
        if (!(error instanceof tpApp.AuthRequired)) {
          result.replaceChildren(el("p", { class: "error", role: "alert", text: error.message }));
        }
      }
    });
    const [routing, ...others] = data.scenarios;
    page.append(
      routingCard(routing, windowFlags),
      el("div", { class: "grid3" }, others.map((s) => scenarioCard(s, windowFlags, refine))),
      el("div", { class: "grid-whatif" }, form, result),
      el("section", { class: "card", id: "whatif-calibration", "aria-label": "Calibration" },
        el("h2", {}, "What the model is calibrated on ", provenanceBadge("modeled")),
        note(`${data.calibrated_on[0].toUpperCase()}${data.calibrated_on.slice(1)}.`),
        el("dl", { class: "facts" },
          el("dt", { text: "requests calibrated on" }), el("dd", { text: fmtNum(cal.requests) }),
          el("dt", { text: "prefix-cache hit ratio (recorded)" }),
          el("dd", { text: fmtPct(cal.prefix_cache_hit_ratio) }),
          el("dt", { text: "most the window's repeats allow" }),
          el("dd", { id: "wi-cacheable", text: `${fmtPct(cal.cacheable_hit_ratio)} (`
            + `${fmtNum(cal.fingerprinted_requests)} requests with prefix fingerprints)` }),
          el("dt", { text: "decode batch (measured)" }), el("dd", { text: fmtNum(cal.decode_batch, 2) }),
          el("dt", { text: "GPU utilization (measured)" }), el("dd", { text: fmtPct(cal.gpu_utilization) }),
          el("dt", { text: "model to attributed GPU seconds" }),
          el("dd", { text: `×${fmtNum(cal.model_to_measured_factor, 3)}` })),
        el("p", { class: "note cli" }, "The baseline from the CLI: ",
           el("code", { text: cliLine(windowFlags) }))));
    return page;
  }

  function renderProjection(out) {
    const flags = [];
    const s = out.scenario;
    if (out.routing) flags.push("prefix-affine router");
    if (s.cache_hit_rate_delta && !out.routing) flags.push(`hit ratio ${fmtPp(s.cache_hit_rate_delta * 100)}`);
    if (s.spec_decode_speedup !== 1) flags.push(`${fmtNum(s.spec_decode_speedup, 2)}× decode`);
    if (isNum(s.gpu_utilization)) flags.push(`GPU utilization ${fmtPct(s.gpu_utilization)}`);
    if (s.quantization) flags.push(s.quantization);
    return el("section", { class: "card", "aria-label": "Projection" },
      el("h2", {}, "Your scenario ", provenanceBadge("modeled")),
      note(`${flags.join(" · ") || "no change"}: engine ${out.engine || "roofline"}, `
           + "calibrated on the window's requests (the same model as `tokenpath whatif`)."),
      projectionTable(out, "Baseline and projected figures"));
  }

  window.tpViews = { overview, requests, request, leaks, whatif };
})();
