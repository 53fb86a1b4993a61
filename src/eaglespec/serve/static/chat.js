// The eaglespec chat page: streams replies from this server's /v1/chat/completions with the
// `eaglespec` request extension ({"token_origin": true}, docs/serving.md), which adds to every
// chunk its tokens (index, text, origin) and its verification steps (accepted, emitted, tree_size).
// Reply text only ever reaches the page through textContent / text nodes, never as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const ORIGINS = ["draft", "bonus", "recovered", "target"];

  const state = {
    key: null,         // the API key, in memory only
    history: [],       // the conversation sent with each request: {role, content}
    controller: null,  // the AbortController of the request in flight
    last: null,        // the latest finished reply: {messages, params, text, stats}
    epoch: 0,          // bumped by Reset: a request from before it leaves the new conversation alone
  };

  class HttpError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // -- talking to the server ---------------------------------------------------------------------
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (state.key !== null) h.Authorization = "Bearer " + state.key;
    return h;
  }

  async function request(path, init = {}) {
    for (;;) {
      const response = await fetch(path, { ...init, headers: headers() });
      if (response.ok) return response;
      let message = response.statusText;
      try {
        const body = await response.json();
        if (body && body.error && body.error.message) message = body.error.message;
      } catch (e) { /* not JSON */ }
      if (response.status !== 401) throw new HttpError(response.status, message);
      await askKey(state.key === null ? "This server needs an API key." : "The server refused that key: " + message);
    }
  }

  function askKey(message) {
    const dialog = $("key-dialog");
    $("key-message").textContent = message + " It stays in this tab's memory only.";
    $("key").value = "";
    return new Promise((resolve, reject) => {
      let given = false;
      $("key-form").onsubmit = (event) => {
        event.preventDefault();
        given = true;
        state.key = $("key").value;
        dialog.close();
        resolve();
      };
      dialog.onclose = () => given || reject(new HttpError(401, "no API key given"));  // Escape
      dialog.showModal();
    });
  }

  // Server-sent events of a fetch response: yields each `data:` payload parsed, until [DONE].
  async function* events(response) {
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
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          const event = JSON.parse(data);
          if (event.error) throw new HttpError(500, event.error.message);
          yield event;
        }
      }
    }
  }

  // One streamed completion. on: {tree(label), tokens(spans), steps(steps)}. Returns the text, the
  // final statistics and the finish reason; an abort (the Stop button) ends it with finish "stopped".
  async function complete(messages, params, speculative, signal, on) {
    const body = {
      messages, stream: true, max_tokens: params.maxTokens, temperature: params.temperature, top_p: params.topP,
      eaglespec: { token_origin: true, speculative },
    };
    let text = "", stats = null, finish = null;
    try {
      const response = await request("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal });
      for await (const chunk of events(response)) {
        const ext = chunk.eaglespec || {};
        if (ext.tree !== undefined) on.tree(ext.tree);
        if (ext.tokens) on.tokens(ext.tokens);
        if (ext.steps && ext.steps.length) on.steps(ext.steps);
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        if (choice.delta && choice.delta.content) text += choice.delta.content;
        if (choice.finish_reason) {
          finish = choice.finish_reason;
          stats = ext;
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") throw e;
      finish = "stopped";
    }
    return { text, stats, finish };
  }

  // -- the reply's live view ---------------------------------------------------------------------
  function element(tag, className, text) {
    const el = document.createElement(tag);
    if (className) el.className = className;
    if (text !== undefined) el.textContent = text;
    return el;
  }

  function addMessage(role, text) {
    $("empty").hidden = true;
    const box = element("div", "msg " + role);
    box.append(element("div", "role", role === "user" ? "you" : "assistant"));
    const body = element("div", "body", text);
    box.append(body);
    const meta = element("div", "meta");
    box.append(meta);
    $("messages").append(box);
    box.scrollIntoView({ block: "end" });
    return { box, body, meta };
  }

  class Live {
    // Counts a reply's tokens and steps as they stream and draws them into the side panel.
    constructor(body) {
      this.body = body;            // where tokens go (null: count only)
      this.tokens = 0;
      this.lastIndex = -1;
      this.lastSpan = null;
      this.steps = [];
      this.start = performance.now();
    }

    addTokens(spans) {
      for (const span of spans) {
        if (span.i !== this.lastIndex) {
          this.tokens += 1;
          this.lastIndex = span.i;
          if (this.body) {
            this.lastSpan = element("span", "tok " + (ORIGINS.includes(span.origin) ? span.origin : "target"));
            this.lastSpan.dataset.i = String(span.i);
            this.body.append(this.lastSpan);
          }
        }
        if (this.lastSpan) this.lastSpan.append(document.createTextNode(span.text));
      }
    }

    addSteps(steps) {
      this.steps.push(...steps);
    }

    tau() {
      if (!this.steps.length) return null;
      return this.steps.reduce((sum, s) => sum + s.emitted, 0) / this.steps.length;
    }

    tokensPerSecond() {
      const seconds = (performance.now() - this.start) / 1000;
      return seconds > 0 ? this.tokens / seconds : null;
    }
  }

  function fixed(x, digits) {
    return x === null || x === undefined || !isFinite(x) ? "–" : x.toFixed(digits);
  }

  function drawStats(live, finalStats) {
    const tps = finalStats ? finalStats.tokens_per_second : live.tokensPerSecond();
    $("tps").textContent = fixed(tps, 1);
    $("tau").textContent = fixed(finalStats ? finalStats.tau : live.tau(), 2);
    $("count").textContent = String(live.tokens);
    $("steps").textContent = String(live.steps.length);
    drawHistogram(live.steps);
  }

  function drawHistogram(steps) {
    const counts = [];
    for (const s of steps) {
      while (counts.length <= s.accepted) counts.push(0);
      counts[s.accepted] += 1;
    }
    while (counts.length < 4) counts.push(0);
    const most = Math.max(1, ...counts);
    const chart = $("histogram");
    chart.replaceChildren();
    counts.forEach((n, accepted) => {
      const column = element("div", "column");
      column.title = `${n} step${n === 1 ? "" : "s"} accepted ${accepted} draft token${accepted === 1 ? "" : "s"}`;
      column.dataset.accepted = String(accepted);
      column.dataset.steps = String(n);
      const bar = element("div", "bar");
      bar.style.height = `${Math.round((100 * n) / most)}%`;
      column.append(element("div", "count", n ? String(n) : ""), bar, element("div", "label", String(accepted)));
      chart.append(column);
    });
  }

  function drawTree(label, live) {
    const last = live.steps[live.steps.length - 1];
    $("tree").textContent = label + (last ? ` · last step verified ${last.tree_size} token${last.tree_size === 1 ? "" : "s"}` : "");
  }

  // -- actions -----------------------------------------------------------------------------------
  function params() {
    return {
      temperature: Number($("temperature").value),
      topP: Number($("top-p").value),
      maxTokens: Math.max(1, Math.round(Number($("max-tokens").value))),
    };
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
    $("compare").disabled = busy || state.last === null;
  }

  function status(text) {
    $("status").textContent = text;
  }

  async function send(content) {
    const system = $("system").value.trim();
    state.history.push({ role: "user", content });
    const messages = (system ? [{ role: "system", content: system }] : []).concat(state.history);
    addMessage("user", content);
    const reply = addMessage("assistant", "");
    reply.body.classList.add("reply");
    reply.body.dataset.state = "streaming";
    const live = new Live(reply.body);
    let tree = "–";
    const p = params();
    const epoch = state.epoch;
    state.controller = new AbortController();
    state.last = null;
    $("comparison").hidden = true;
    setBusy(true);
    status("");
    drawStats(live, null);
    try {
      const result = await complete(messages, p, true, state.controller.signal, {
        tree: (label) => { tree = label; drawTree(tree, live); },
        tokens: (spans) => { live.addTokens(spans); drawStats(live, null); },
        steps: (steps) => { live.addSteps(steps); drawStats(live, null); drawTree(tree, live); },
      });
      if (epoch !== state.epoch) return;
      state.history.push({ role: "assistant", content: result.text });  // a stopped reply's part stays
      reply.body.dataset.state = result.finish === "stopped" ? "stopped" : "done";
      drawStats(live, result.stats);
      const s = result.stats;
      reply.meta.textContent = s
        ? `${live.tokens} tokens · tau ${fixed(s.tau, 2)} · ${fixed(s.tokens_per_second, 1)} tokens/s · ${result.finish}`
        : `${live.tokens} tokens · stopped`;
      if (s) state.last = { messages, params: p, text: result.text, stats: s };
    } catch (e) {
      if (epoch !== state.epoch) return;
      state.history.pop();
      reply.body.dataset.state = "error";
      reply.meta.textContent = "error: " + e.message;
      reply.box.classList.add("error");
    } finally {
      if (epoch === state.epoch) {
        state.controller = null;
        setBusy(false);
      }
    }
  }

  async function compare() {
    const last = state.last;
    if (!last) return;
    state.controller = new AbortController();
    setBusy(true);
    const panel = $("comparison");
    panel.hidden = false;
    panel.dataset.state = "running";
    for (const id of ["cmp-vanilla", "cmp-speedup", "cmp-identical"]) $(id).textContent = "…";
    $("cmp-eagle").textContent = `${fixed(last.stats.tokens_per_second, 1)} tokens/s (tau ${fixed(last.stats.tau, 2)})`;
    $("cmp-text").textContent = "";
    $("cmp-note").textContent = "running the same prompt without drafting…";
    const live = new Live(null);
    try {
      const result = await complete(last.messages, last.params, false, state.controller.signal, {
        tree: () => {}, tokens: (spans) => live.addTokens(spans), steps: () => {},
      });
      if (!result.stats) {
        $("cmp-note").textContent = "stopped";
        panel.dataset.state = "stopped";
        return;
      }
      const vanilla = result.stats.tokens_per_second, eagle = last.stats.tokens_per_second;
      const identical = result.text === last.text;
      $("cmp-vanilla").textContent = `${fixed(vanilla, 1)} tokens/s`;
      $("cmp-speedup").textContent = vanilla > 0 ? `${fixed(eagle / vanilla, 2)}x` : "–";
      $("cmp-identical").textContent = identical ? "yes" : "no";
      $("cmp-identical").className = identical ? "same" : "differs";
      $("cmp-text").textContent = result.text;
      $("cmp-note").textContent = last.params.temperature > 0
        ? "Sampling (temperature > 0): the two runs draw differently, so their texts may differ; greedy ones match."
        : "Greedy: EAGLE is lossless, so the texts match (up to floating-point near-ties).";
      panel.dataset.identical = String(identical);
      panel.dataset.state = "done";
    } catch (e) {
      $("cmp-note").textContent = "error: " + e.message;
      panel.dataset.state = "error";
    } finally {
      state.controller = null;
      setBusy(false);
    }
  }

  function reset() {
    if (state.controller) state.controller.abort();
    state.controller = null;
    state.epoch += 1;
    state.history = [];
    state.last = null;
    $("messages").replaceChildren();
    $("empty").hidden = false;
    $("comparison").hidden = true;
    drawStats(new Live(null), null);
    $("tree").textContent = "–";
    setBusy(false);
  }

  async function connect() {
    try {
      const models = await (await request("/v1/models")).json();
      const card = models.data[0];
      $("model").textContent = `${card.id} · context ${card.max_model_len} tokens`;
    } catch (e) {
      $("model").textContent = "not connected: " + e.message;
    }
  }

  // -- wiring ------------------------------------------------------------------------------------
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const content = $("input").value;
    if (!content.trim() || state.controller) return;
    $("input").value = "";
    send(content);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("reset").addEventListener("click", reset);
  $("compare").addEventListener("click", compare);
  $("show-origin").addEventListener("change", (event) => {
    document.body.classList.toggle("plain", !event.target.checked);
  });
  drawHistogram([]);
  connect();
})();
