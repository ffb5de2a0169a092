// The cache dashboard: polls GET /v1/dashboard and GET /v1/cache/entries once a second (one
// poll at a time, paused while the tab is hidden) and draws what they say.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const el = VG.el;
  const PERIOD_MS = 1000;
  const CHART_SECONDS = 300;
  let stopped = false; // a 401 stops polling until a key is given

  // A line chart of series values against seconds (t <= 0); gaps (null) break the line.
  function drawChart(canvas, t, values, { max = 1, percent = true, colour = "#2f6fdf" } = {}) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.width;
    const height = canvas.clientHeight || canvas.height;
    if (canvas.width !== Math.round(width * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const style = getComputedStyle(document.body);
    const left = 36, right = 6, top = 6, bottom = 16;
    const x = (s) => left + ((s + CHART_SECONDS) / CHART_SECONDS) * (width - left - right);
    const y = (v) => top + (1 - Math.min(v / max, 1)) * (height - top - bottom);
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillStyle = style.getPropertyValue("--muted") || "#777";
    ctx.strokeStyle = style.getPropertyValue("--grid") || "#ddd";
    ctx.lineWidth = 1;
    for (const f of [0, 0.5, 1]) {
      ctx.beginPath();
      ctx.moveTo(left, y(f * max));
      ctx.lineTo(width - right, y(f * max));
      ctx.stroke();
      ctx.fillText(percent ? `${f * 100}%` : (f * max).toFixed(0), 2, y(f * max) + 3);
    }
    ctx.fillText("−5 min", left, height - 3);
    ctx.fillText("now", width - right - 20, height - 3);
    ctx.strokeStyle = colour;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let drawing = false;
    t.forEach((s, i) => {
      const v = values[i];
      if (v === null || s < -CHART_SECONDS) {
        drawing = false;
        return;
      }
      if (drawing) ctx.lineTo(x(s), y(v));
      else ctx.moveTo(x(s), y(v));
      drawing = true;
    });
    ctx.stroke();
  }

  function showCache(name, stats, series) {
    $(`hit-rate-${name}`).textContent = stats.queries ? VG.formatPercent(stats.hit_rate) : "—";
    const used = stats.capacity_bytes ? stats.bytes / stats.capacity_bytes : 0;
    $(`fill-${name}`).style.width = `${(100 * used).toFixed(1)}%`;
    $(`cache-bytes-${name}`).textContent = stats.enabled
      ? `${VG.formatBytes(stats.bytes)} of ${VG.formatBytes(stats.capacity_bytes)} (${(100 * used).toFixed(1)}%)`
      : "disabled on this server";
    $(`cache-bytes-${name}`).dataset.bytes = stats.bytes;
    $(`entries-${name}`).textContent = stats.entries;
    $(`hits-${name}`).textContent = `${stats.hits} / ${stats.queries}`;
    $(`evictions-${name}`).textContent = stats.evictions;
    drawChart($(`chart-${name}`), series.t, series[`${name}_hit_rate`]);
  }

  // How the prefix cache holds KV (--kv-bits): "8-bit, groups of 64 · 1.1 KiB per token", or
  // the dtype ("bfloat16 · 4.0 KiB per token"); what one cached token costs.
  function showKvFormat(stats) {
    if (stats.kv_bits === undefined) return;
    const held = stats.kv_quantized
      ? `${stats.kv_bits}-bit, groups of ${stats.kv_group_size}`
      : stats.kv_dtype;
    const per = stats.bytes_per_token ? ` · ${VG.formatBytes(stats.bytes_per_token)} per token` : "";
    $("kv-format").textContent = held + per;
  }

  function showEngine(data) {
    $("running").textContent = data.running;
    $("waiting").textContent = data.waiting;
    $("tokens-per-s").textContent = data.tokens_per_s === null ? "—" : data.tokens_per_s.toFixed(1);
    const ttft = data.ttft;
    const ms = (v) => (v === null ? "—" : `${v.toFixed(0)} ms`);
    $("ttft").textContent = ttft.count
      ? `p50 ${ms(ttft.p50_ms)} · p90 ${ms(ttft.p90_ms)} · p99 ${ms(ttft.p99_ms)}`
      : "no requests";
    const span = ttft.window_s === null ? "since start" : `last ${VG.formatAge(ttft.window_s)}`;
    $("ttft-window").textContent = `${ttft.count} request${ttft.count === 1 ? "" : "s"}, ${span}`;
    const speeds = data.series.tokens_per_s;
    const top = Math.max(10, ...speeds.filter((v) => v !== null));
    drawChart($("chart-speed"), data.series.t, speeds, { max: top, percent: false, colour: "#1f9d55" });
  }

  function row(entry) {
    const hash = entry.hash === null ? "(text only)" : entry.hash + (entry.images > 1 ? ` +${entry.images - 1}` : "");
    return el(
      "tr",
      {},
      el("td", { className: "mono", text: hash, title: entry.hashes.join(", ") }),
      el("td", { text: entry.kind }),
      el("td", { text: VG.formatBytes(entry.bytes) }),
      el("td", { text: String(entry.tokens) }),
      el("td", { text: String(entry.hits) }),
      el("td", { text: VG.formatAge(entry.age_s) })
    );
  }

  function showEntries(report) {
    for (const [id, list] of [["largest", report.largest], ["most-hit", report.most_hit]]) {
      const rows = list.map(row);
      if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6, className: "muted", text: "no entries" })));
      $(id).replaceChildren(...rows);
    }
  }

  // Several models behind the server: a picker of the loaded ones (a model's caches live
  // while it is loaded); the charts restart when another is picked.
  let model = null;
  let listed = false;
  async function listModels(current) {
    if (listed) return;
    listed = true;
    const response = await VG.request("/v1/models");
    if (!response.ok) return;
    const cards = (await response.json()).data;
    const pick = $("model-pick");
    pick.hidden = cards.length < 2;
    $("model-name").hidden = cards.length > 1;
    pick.replaceChildren(
      ...cards.map((c) => el("option", { value: c.id, text: `${c.id} (${c.state || "loaded"})` })),
    );
    pick.value = current;
    pick.onchange = () => {
      model = pick.value;
      listed = false; // the states may have changed: listed again with the next sample
      poll();
    };
  }

  async function poll() {
    if (stopped || document.hidden) return;
    try {
      const which = model ? `model=${encodeURIComponent(model)}` : "";
      const [live, entries] = await Promise.all([
        VG.request(`/v1/dashboard?${which}`),
        VG.request(`/v1/cache/entries?limit=10&${which}`),
      ]);
      if (live.status === 401 || entries.status === 401) {
        stopped = true;
        $("status").textContent = "API key needed";
        $("status").classList.add("down");
        return;
      }
      if (!entries.ok) throw new Error(await VG.errorMessage(entries));
      if (live.status === 403) {
        // a tenant's key: its own cache entries; the charts (every tenant's traffic) are the
        // admin key's (docs/security.md)
        showEntries(await entries.json());
        $("status").textContent = "your own cache entries only: the charts need the admin key";
        $("status").classList.remove("down");
        return;
      }
      if (!live.ok) throw new Error(await VG.errorMessage(live));
      const data = await live.json();
      $("model-name").textContent = data.model;
      await listModels(data.model);
      const family = data.caches.family; // the model family, once the engine has loaded
      $("model-family").hidden = !family;
      $("model-family").textContent = family ? `family: ${family.family} · ${family.model_type}` : "";
      // An embedding model or reranker keeps no KV prefix cache (its vectors instead).
      const { vision, prefix } = data.caches;
      if (vision) showCache("vision", vision, data.series);
      else $("cache-bytes-vision").textContent = "none for this model";
      if (prefix) {
        showCache("prefix", prefix, data.series);
        showKvFormat(prefix);
      } else {
        $("cache-bytes-prefix").textContent = "none for this model (it embeds or reranks)";
      }
      $("token-hit-rate").textContent = prefix && prefix.tokens_queried
        ? `${VG.formatPercent(prefix.token_hit_rate)} (${prefix.tokens_hit} of ${prefix.tokens_queried})`
        : "—";
      showEngine(data);
      showEntries(await entries.json());
      $("status").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
      $("status").classList.remove("down");
    } catch (error) {
      $("status").textContent = `not updating: ${error.message}`;
      $("status").classList.add("down");
    }
  }

  async function loop() {
    const started = performance.now();
    await poll();
    setTimeout(loop, Math.max(0, PERIOD_MS - (performance.now() - started)));
  }

  async function clearCaches() {
    if (!window.confirm("Empty the vision and prefix caches? Counters are kept; the next request about each image pays for it again.")) return;
    const which = model ? `?model=${encodeURIComponent(model)}` : "";
    const response = await VG.request(`/v1/cache/clear${which}`, { method: "POST" });
    $("clear-result").textContent = response.ok ? "cleared" : await VG.errorMessage(response);
    poll();
  }

  document.addEventListener("DOMContentLoaded", () => {
    VG.setupKeyPrompt(() => {
      stopped = false;
      poll();
    });
    $("clear-caches").addEventListener("click", clearCaches);
    document.addEventListener("visibilitychange", () => document.hidden || poll());
    loop();
  });
})();
