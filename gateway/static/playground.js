// The playground: images in (file picker, drop, paste, URL), a multi-turn chat streamed from
// the gateway's own /v1/chat/completions (SSE), and per answer what the caches did.
// The whole history is resent each turn, as any OpenAI client does; the prefix cache is what
// makes that cheap, and each answer's badge shows it (x-cache header and usage).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const el = VG.el;
  const state = {
    model: null,
    history: [], // OpenAI messages sent so far (user turns with their images, answers)
    names: [], // per history message: the names of its attachments, in content order
    pending: [], // attachments for the next user turn: {url, name, kind: "image" | "video"}
    controller: null, // AbortController of the request in flight
  };

  // ----- the served model ------------------------------------------------------------------

  async function loadModel() {
    let response;
    try {
      response = await VG.request("/v1/models");
    } catch (_) {
      $("model-name").textContent = "(server unreachable)";
      return;
    }
    if (!response.ok) {
      $("model-name").textContent = response.status === 401 ? "(API key needed)" : "(unavailable)";
      return;
    }
    const cards = (await response.json()).data;
    // Several models behind the server: a picker (each with its state: a model not loaded
    // loads when the first message reaches it); one model: its name.
    const pick = $("model-pick");
    pick.hidden = cards.length < 2;
    $("model-name").hidden = cards.length > 1;
    pick.replaceChildren(
      ...cards.map((c) => el("option", { value: c.id, text: `${c.id} (${c.state || "loaded"})` })),
    );
    pick.onchange = () => chooseModel(cards.find((c) => c.id === pick.value));
    chooseModel(cards.find((c) => c.id === state.model) || cards[0]);
  }

  function chooseModel(card) {
    state.model = card.id;
    $("model-name").textContent = card.id;
    $("model-pick").value = card.id;
    showFamily(card);
    const notice = $("model-notice");
    notice.hidden = !card.notice;
    notice.textContent = card.notice || "";
  }

  // The model's family (gateway/engine/families): "qwen_vl · qwen2_5_vl", "text · qwen3".
  function showFamily(card) {
    const family = $("model-family");
    family.hidden = !card.family;
    family.textContent = card.family ? `family: ${card.family} · ${card.model_type}` : "";
  }

  // ----- images ----------------------------------------------------------------------------

  function readFile(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  // Only images and videos can be attached: anything else is refused here, by name, rather
  // than sent for the server to refuse.
  function mediaKind(type) {
    if (type.startsWith("image/")) return "image";
    return type.startsWith("video/") ? "video" : null;
  }

  const VIDEO_URL = /^data:video\/|\.(mp4|m4v|webm|mkv|mov|avi)(\?.*)?$/i;

  function showAttachError(message) {
    $("attach-error").textContent = message;
    $("attach-error").hidden = !message;
  }

  async function addFiles(files) {
    const refused = [];
    for (const file of files) {
      const name = file.name || "pasted file";
      const kind = mediaKind(file.type || "");
      if (kind) state.pending.push({ url: await readFile(file), name, kind });
      else refused.push(name);
    }
    showAttachError(
      refused.length
        ? `Not attached: ${refused.map((n) => `"${n}"`).join(", ")} ${refused.length === 1 ? "is" : "are"} not an image or a video.`
        : ""
    );
    renderThumbs();
  }

  function addUrl() {
    const url = $("image-url").value.trim();
    if (!url) return;
    state.pending.push({ url, name: url, kind: VIDEO_URL.test(url) ? "video" : "image" });
    $("image-url").value = "";
    showAttachError("");
    renderThumbs();
  }

  function thumbnail(image, onRemove) {
    const media = image.kind === "video"
      ? el("video", { src: image.url, title: image.name, muted: true, preload: "metadata" })
      : el("img", { src: image.url, alt: image.name, title: image.name });
    const frame = el("figure", { className: "thumb", testid: "thumbnail" }, media);
    // A URL the browser cannot show (a server-side path, a broken file) still gets sent;
    // the server decides, and its error says what is wrong.
    media.addEventListener("error", () => media.replaceWith(el("span", { className: "noimg", text: image.name })));
    if (onRemove) {
      frame.append(el("button", { type: "button", className: "remove", title: "remove", text: "×" }));
      frame.lastChild.addEventListener("click", onRemove);
    }
    return frame;
  }

  function renderThumbs() {
    const box = $("thumbs");
    box.replaceChildren(
      ...state.pending.map((image, i) =>
        thumbnail(image, () => {
          state.pending.splice(i, 1);
          renderThumbs();
        })
      )
    );
  }

  // ----- chat view -------------------------------------------------------------------------

  // At most once a frame: reading scrollHeight forces a layout, and a fast stream sends
  // hundreds of chunks a second.
  let scrollQueued = false;
  function scrollDown() {
    if (scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => {
      scrollQueued = false;
      const chat = $("chat");
      chat.scrollTop = chat.scrollHeight;
    });
  }

  function showUser(text, images) {
    $("empty").hidden = true;
    const node = el(
      "article",
      { className: "msg user", testid: "question-sent" },
      images.length ? el("div", { className: "thumbs" }, ...images.map((i) => thumbnail(i))) : null,
      text ? el("p", { text }) : null
    );
    $("chat").append(node);
    return node;
  }

  function showAssistant() {
    const answer = el("div", { className: "text", testid: "answer" });
    const badge = el("div", { className: "badge", testid: "cache-badge", text: "waiting for the first token…" });
    const root = el("article", { className: "msg assistant", "data-state": "streaming" }, answer, badge);
    $("chat").append(root);
    scrollDown();
    return { root, answer, badge };
  }

  // The server's error; when its `param` points into a message's content
  // (`messages[i].content[j]...`), the attachment's name is put first.
  function errorText(error) {
    const at = /^messages\[(\d+)\]\.content\[(\d+)\]/.exec(error.param || "");
    const name = at && (state.names[Number(at[1])] || [])[Number(at[2])];
    return name ? `${name}: ${error.message}` : error.message;
  }

  function showError(view, message) {
    view.root.dataset.state = "error";
    view.answer.remove();
    view.badge.remove();
    view.root.append(el("div", { className: "error", testid: "error", role: "alert", text: message }));
  }

  function parseXCache(header) {
    const out = {};
    for (const item of (header || "").split(";")) {
      const [name, value] = item.split("=").map((s) => s && s.trim());
      if (name && value !== undefined) out[name] = Number(value);
    }
    return out;
  }

  // The per-answer summary. Its text always contains the cached token count.
  function showStats(view, run, stopped) {
    if (!run.usage && !Object.keys(run.cache).length) {
      view.badge.textContent = "stopped before the server answered";
      return;
    }
    const usage = run.usage || {};
    const cached = usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : run.cache["cached-tokens"];
    const prompt = usage.prompt_tokens !== undefined ? usage.prompt_tokens : run.cache["prompt-tokens"];
    const tokens = usage.completion_tokens !== undefined ? usage.completion_tokens : run.chunks;
    const ttft = run.firstAt === null ? null : run.firstAt - run.sentAt;
    const decodeSeconds = run.firstAt === null ? 0 : (run.lastAt - run.firstAt) / 1000;
    const speed = tokens > 1 && decodeSeconds > 0 ? (tokens - 1) / decodeSeconds : null;
    const hits = run.cache["vision-hits"] || 0;
    const misses = run.cache["vision-misses"] || 0;
    const parts = [
      `cached ${cached} of ${prompt} prompt tokens`,
      `vision ${hits} hit${hits === 1 ? "" : "s"}, ${misses} miss${misses === 1 ? "" : "es"}`,
      ttft === null ? "no token" : `TTFT ${ttft.toFixed(0)} ms`,
      speed === null ? `${tokens} token${tokens === 1 ? "" : "s"}` : `${speed.toFixed(1)} tok/s (${tokens} tokens)`,
    ];
    if (stopped) parts.push("stopped");
    view.badge.textContent = parts.join(" · ");
    Object.assign(view.badge.dataset, {
      cachedTokens: cached,
      promptTokens: prompt,
      visionHits: hits,
      visionMisses: misses,
      completionTokens: tokens,
    });
    view.badge.classList.toggle("hit", cached > 0 || hits > 0);
  }

  // ----- one turn --------------------------------------------------------------------------

  // Reads the SSE body; calls onChunk(parsed) for each data event until [DONE].
  async function readEvents(response, onChunk) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          onChunk(JSON.parse(data));
        }
      }
    }
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  async function send() {
    if (state.controller) return;
    addUrl(); // a URL typed but not added yet belongs to this turn
    const text = $("question").value.trim();
    if (!text && !state.pending.length) return;
    if (!state.model) await loadModel();
    const images = state.pending;
    const part = (i) => (i.kind === "video" ? { type: "video_url", video_url: { url: i.url } } : { type: "image_url", image_url: { url: i.url } });
    const content = images.length ? [...images.map(part), { type: "text", text }] : text;
    const userNode = showUser(text, images);
    state.pending = [];
    showAttachError("");
    renderThumbs();
    $("question").value = "";
    state.history.push({ role: "user", content });
    state.names.push(images.map((i) => i.name));
    const view = showAssistant();
    const run = { sentAt: performance.now(), firstAt: null, lastAt: null, chunks: 0, usage: null, cache: {}, text: "" };
    const controller = (state.controller = new AbortController());
    setBusy(true);
    const rollBack = () => {
      state.history.pop();
      state.names.pop();
      userNode.classList.add("failed");
    };
    try {
      if (!state.model) throw new Error("the model list could not be read (see above)");
      const response = await VG.request("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        signal: controller.signal,
        body: JSON.stringify({
          model: state.model,
          messages: state.history,
          stream: true,
          stream_options: { include_usage: true },
          temperature: Number($("temperature").value),
          max_tokens: Number($("max-tokens").value),
        }),
      });
      if (!response.ok) throw new Error(errorText(await VG.errorDetails(response)));
      run.cache = parseXCache(response.headers.get("x-cache"));
      await readEvents(response, (chunk) => {
        if (chunk.error) throw new Error(errorText(chunk.error));
        if (chunk.usage) run.usage = chunk.usage;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          const now = performance.now();
          if (run.firstAt === null) run.firstAt = now;
          run.lastAt = now;
          run.chunks += 1;
          run.text += delta.content;
          view.answer.append(delta.content); // not textContent = run.text: O(chunk), not O(answer)
          scrollDown();
        }
      });
      state.history.push({ role: "assistant", content: run.text });
      state.names.push([]);
      view.root.dataset.state = "done";
      showStats(view, run, false);
    } catch (error) {
      if (error.name === "AbortError") {
        // The server sees the connection close and frees the request's batch row.
        if (run.text) {
          state.history.push({ role: "assistant", content: run.text });
          state.names.push([]);
        } else rollBack();
        view.root.dataset.state = "stopped";
        showStats(view, run, true);
      } else {
        rollBack();
        showError(view, error.message);
      }
    } finally {
      state.controller = null;
      setBusy(false);
      scrollDown();
    }
  }

  // ----- wiring ----------------------------------------------------------------------------

  function isFileDrag(event) {
    return event.dataTransfer && Array.from(event.dataTransfer.types).includes("Files");
  }

  document.addEventListener("DOMContentLoaded", () => {
    VG.setupKeyPrompt(loadModel);
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      send();
    });
    $("question").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        send();
      }
    });
    $("stop").addEventListener("click", () => state.controller && state.controller.abort());
    $("new-chat").addEventListener("click", () => {
      if (state.controller) state.controller.abort();
      state.history = [];
      state.names = [];
      $("chat").replaceChildren($("empty"));
      $("empty").hidden = false;
    });
    $("image-input").addEventListener("change", async (event) => {
      await addFiles(Array.from(event.target.files));
      event.target.value = ""; // choosing the same file again still fires
    });
    $("add-url").addEventListener("click", addUrl);
    $("image-url").addEventListener("keydown", (event) => {
      if (event.key === "Enter") {
        event.preventDefault();
        addUrl();
      }
    });
    document.addEventListener("paste", (event) => {
      const files = Array.from(event.clipboardData.files);
      if (files.length) {
        event.preventDefault();
        addFiles(files);
      }
    });
    document.addEventListener("dragover", (event) => {
      if (isFileDrag(event) || event.dataTransfer.types.includes("text/uri-list")) {
        event.preventDefault();
        document.body.classList.add("dragging");
      }
    });
    document.addEventListener("dragleave", (event) => {
      if (!event.relatedTarget) document.body.classList.remove("dragging");
    });
    document.addEventListener("drop", (event) => {
      document.body.classList.remove("dragging");
      if (isFileDrag(event)) {
        event.preventDefault();
        addFiles(Array.from(event.dataTransfer.files));
      } else if (event.dataTransfer.types.includes("text/uri-list")) {
        event.preventDefault();
        $("image-url").value = event.dataTransfer.getData("text/uri-list").split("\n")[0].trim();
        addUrl();
      }
    });
    loadModel();
  });
})();
