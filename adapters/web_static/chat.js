// The mnemo web chat page. Plain JavaScript, no dependencies.
//
// * A random user id is kept in localStorage, so a reload continues the same chat;
//   the transcript is kept there too (the server keeps the real history).
// * Every message gets a client id; it stays "pending" until the server acknowledges
//   it (the gateway stored it) and is resent after a reconnect — the server drops
//   duplicates by id.
// * A message longer than the server takes (max_chars in its hello frame, counted in
//   code points like the server does) is refused here with a note: nothing is sent, the
//   text stays in the box. An error frame naming a message with retry false means the
//   server refused it for good: it leaves the pending store (and localStorage) at once.
// * Files (images, PDFs, text) are posted to /upload when picked, one request each (at
//   most 10 MB: larger ones are refused here); the next message names their upload ids
//   and may then be empty. A refused file gets the server's one-line reason as a note.
// * Replies are rendered from Markdown by building DOM nodes with textContent only:
//   the bot's text is never parsed as HTML, so it cannot inject markup.
"use strict";

(function () {
  const USER_KEY = "mnemo.user";
  const HISTORY_LIMIT = 200;
  const ID_RE = /^[A-Za-z0-9_-]{8,64}$/;
  const MAX_FRAME_BYTES = 256 * 1024; // the server's MAX_FRAME_BYTES
  let maxChars = 32000; // the server's MAX_TEXT_CHARS; its hello frame says the real one

  const $ = (id) => document.getElementById(id);
  const logEl = $("log");
  const statusEl = $("status");
  const typingEl = $("typing");
  const form = $("composer");
  const input = $("input");
  const noteEl = $("note");
  const fileEl = $("file");
  const attachedEl = $("attached");
  const MAX_UPLOAD_BYTES = 10 * 1024 * 1024; // the server's MAX_UPLOAD_BYTES
  let attached = []; // uploads for the next message: {id, name}

  // --- storage (a private window may refuse localStorage: keep working in memory) ---
  const memoryStore = {};
  function load(key) {
    try { return window.localStorage.getItem(key); } catch (e) { return memoryStore[key] || null; }
  }
  function save(key, value) {
    try { window.localStorage.setItem(key, value); } catch (e) { memoryStore[key] = value; }
  }

  // crypto.getRandomValues works on plain http too (randomUUID needs a secure context).
  function randomId(bytes) {
    const buf = new Uint8Array(bytes);
    window.crypto.getRandomValues(buf);
    return Array.from(buf, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  let userId = load(USER_KEY);
  if (!userId || !ID_RE.test(userId)) {
    userId = randomId(16);
    save(USER_KEY, userId);
  }
  const historyKey = "mnemo.history." + userId;

  let history = [];
  try { history = JSON.parse(load(historyKey) || "[]"); } catch (e) { history = []; }
  if (!Array.isArray(history)) history = [];
  const shownReplies = new Set();
  const pending = new Map(); // client id -> {id, text}

  function persist() {
    history = history.slice(-HISTORY_LIMIT);
    save(historyKey, JSON.stringify(history));
  }

  // --- Markdown, the small subset models use, as DOM nodes ---------------------------
  const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\[[^\]\n]+\]\(https?:\/\/[^\s)]+\))|(\*[^*\s][^*\n]*\*)|((?<![A-Za-z0-9])_[^_\n]+_(?![A-Za-z0-9]))/g;

  function inline(text, parent) {
    let last = 0;
    for (const m of text.matchAll(INLINE)) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      const tok = m[0];
      let node;
      if (m[1]) {
        node = document.createElement("code");
        node.textContent = tok.slice(1, -1);
      } else if (m[2]) {
        node = document.createElement("strong");
        inline(tok.slice(2, -2), node);
      } else if (m[3]) {
        const split = tok.indexOf("](");
        node = document.createElement("a");
        node.href = tok.slice(split + 2, -1);
        node.rel = "noopener noreferrer";
        node.target = "_blank";
        node.textContent = tok.slice(1, split);
      } else {
        node = document.createElement("em");
        inline(tok.slice(1, -1), node);
      }
      parent.appendChild(node);
      last = m.index + tok.length;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function lines(block, parent) {
    block.split("\n").forEach((line, i) => {
      if (i > 0) parent.appendChild(document.createElement("br"));
      inline(line, parent);
    });
  }

  function paragraph(block, parent) {
    const rows = block.split("\n");
    const bullet = /^\s*[-*•]\s+/;
    const numbered = /^\s*\d+[.)]\s+/;
    const heading = /^#{1,6}\s+/;
    if (rows.every((r) => bullet.test(r)) || rows.every((r) => numbered.test(r))) {
      const list = document.createElement(bullet.test(rows[0]) ? "ul" : "ol");
      for (const r of rows) {
        const li = document.createElement("li");
        inline(r.replace(bullet, "").replace(numbered, ""), li);
        list.appendChild(li);
      }
      parent.appendChild(list);
      return;
    }
    const p = document.createElement("p");
    if (heading.test(rows[0])) {
      const strong = document.createElement("strong");
      inline(rows[0].replace(heading, ""), strong);
      p.appendChild(strong);
      if (rows.length > 1) p.appendChild(document.createElement("br"));
      lines(rows.slice(1).join("\n"), p);
    } else {
      lines(block, p);
    }
    parent.appendChild(p);
  }

  function renderMarkdown(text, parent) {
    const fence = /```[^\n`]*\n?([\s\S]*?)(?:```|$)/g;
    let last = 0;
    const prose = (chunk) => {
      for (const block of chunk.split(/\n{2,}/)) {
        if (block.trim()) paragraph(block.replace(/^\n+|\n+$/g, ""), parent);
      }
    };
    for (const m of text.matchAll(fence)) {
      prose(text.slice(last, m.index));
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      code.textContent = m[1].replace(/\n$/, "");
      pre.appendChild(code);
      parent.appendChild(pre);
      last = m.index + m[0].length;
    }
    prose(text.slice(last));
  }

  // --- the transcript ----------------------------------------------------------------
  function show(entry) {
    const li = document.createElement("li");
    li.className = "msg " + (entry.role === "user" ? "me" : "bot");
    if (entry.id) li.dataset.id = entry.id;
    const label = document.createElement("span");
    label.className = "label";
    let who = entry.role === "user" ? "You" : "mnemo";
    if (entry.scheduled) who += " · scheduled";
    if (entry.possible_duplicate) who += " · possible duplicate";
    label.textContent = who;
    li.appendChild(label);
    const body = document.createElement("div");
    body.className = "body";
    if (entry.role === "user") lines(entry.text, body);
    else renderMarkdown(entry.text, body);
    li.appendChild(body);
    logEl.appendChild(li);
    li.scrollIntoView({ block: "end" });
    return li;
  }

  // --- live replies: token frames while a reply is generated -------------------------
  // Shown line by line (inline formatting only) in a bubble of their own, never
  // stored; the final "reply" frame names the bubble it replaces.
  const live = new Map(); // stream id -> { li, text }

  function onToken(frame) {
    typingEl.hidden = true;
    let item = live.get(frame.id);
    if (!item) {
      const li = show({ role: "bot", text: "" });
      li.classList.add("live");
      li.dataset.stream = frame.id;
      item = { li: li, text: "" };
      live.set(frame.id, item);
    }
    item.text = typeof frame.text === "string" ? frame.text : item.text + String(frame.delta || "");
    const body = item.li.querySelector(".body");
    body.textContent = "";
    lines(item.text, body);
    item.li.scrollIntoView({ block: "end" });
  }

  function endLive(id) {
    const item = live.get(id);
    if (item) { item.li.remove(); live.delete(id); }
  }

  function markPending(id, isPending) {
    const li = logEl.querySelector('li[data-id="' + id + '"]');
    if (li) li.classList.toggle("pending", isPending);
  }

  function note(text) {
    noteEl.textContent = text;
    noteEl.hidden = !text;
  }

  function frameFor(item) {
    const frame = { type: "message", id: item.id, text: item.text };
    if (item.attachments && item.attachments.length) frame.attachments = item.attachments;
    return JSON.stringify(frame);
  }

  // Why the server could never take this text, or "" if it can.
  function tooLong(text) {
    const chars = Array.from(text).length; // code points, as the server counts
    if (chars > maxChars) {
      return "This message has " + chars.toLocaleString() + " characters; the limit is " +
        maxChars.toLocaleString() + ". Nothing was sent: shorten it or split it into several messages.";
    }
    if (new TextEncoder().encode(frameFor({ id: "x".repeat(24), text: text })).length > MAX_FRAME_BYTES) {
      return "This message is too large to send. Nothing was sent: shorten it or split it.";
    }
    return "";
  }

  // The server refused a message for good: it is never resent, not even after a reload.
  function refuse(id, reason) {
    pending.delete(id);
    markPending(id, false);
    const li = logEl.querySelector('li[data-id="' + id + '"]');
    if (li) { li.classList.add("error"); li.title = reason; }
    const entry = history.find((e) => e.id === id && e.role === "user");
    if (entry) { delete entry.pending; entry.error = reason; persist(); }
  }

  for (const entry of history) {
    show(entry);
    if (entry.role === "bot" && entry.id) shownReplies.add(entry.id);
    if (entry.role === "user" && entry.error) {
      const li = logEl.querySelector('li[data-id="' + entry.id + '"]');
      if (li) { li.classList.add("error"); li.title = entry.error; }
    }
    if (entry.role === "user" && entry.pending) {
      const sent = typeof entry.sent === "string" ? entry.sent : entry.text; // without the "[attached: …]" line
      pending.set(entry.id, { id: entry.id, text: sent, attachments: entry.attachments || [] });
      markPending(entry.id, true);
    }
  }
  // A page from before the size check may have stored a message that can never be sent.
  for (const item of Array.from(pending.values())) {
    const why = tooLong(item.text);
    if (why) refuse(item.id, why);
  }

  // --- the websocket -----------------------------------------------------------------
  let socket = null;
  let backoff = 500;

  function setStatus(text) { statusEl.textContent = text; }

  function transmit(item) {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(frameFor(item));
    }
  }

  function onFrame(frame) {
    if (frame.type === "hello") {
      typingEl.hidden = !frame.typing;
      if (Number.isInteger(frame.max_chars) && frame.max_chars > 0) maxChars = frame.max_chars;
      for (const item of Array.from(pending.values())) {
        const why = tooLong(item.text);
        if (why) refuse(item.id, why);
        else transmit(item);
      }
    } else if (frame.type === "ack") {
      pending.delete(frame.id);
      markPending(frame.id, false);
      const entry = history.find((e) => e.id === frame.id && e.role === "user");
      if (entry) { delete entry.pending; persist(); }
    } else if (frame.type === "typing") {
      typingEl.hidden = !frame.active;
    } else if (frame.type === "token") {
      onToken(frame);
    } else if (frame.type === "reply") {
      typingEl.hidden = true;
      if (typeof frame.replaces === "string") endLive(frame.replaces);
      if (shownReplies.has(frame.id)) return; // resent after a crash; already shown
      shownReplies.add(frame.id);
      const entry = { role: "bot", id: frame.id, text: frame.text,
                      scheduled: !!frame.scheduled, possible_duplicate: !!frame.possible_duplicate };
      history.push(entry);
      persist();
      show(entry);
    } else if (frame.type === "error") {
      if (frame.id && frame.retry !== true) refuse(frame.id, frame.text);
      setStatus("error: " + frame.text);
      if (frame.id) note(frame.retry === true ? frame.text : "Not sent: " + frame.text);
    }
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + window.location.host + "/ws?user=" + encodeURIComponent(userId);
    socket = new WebSocket(url);
    socket.addEventListener("open", () => { backoff = 500; setStatus("connected"); });
    socket.addEventListener("message", (ev) => {
      let frame;
      try { frame = JSON.parse(ev.data); } catch (e) { return; }
      onFrame(frame);
    });
    socket.addEventListener("close", () => {
      typingEl.hidden = true;
      setStatus("disconnected — reconnecting…");
      window.setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 10000);
    });
  }

  // --- attachments ---------------------------------------------------------------------
  function showAttached() {
    attachedEl.textContent = attached.length ? "Attached: " + attached.map((a) => a.name).join(", ") : "";
    attachedEl.hidden = !attached.length;
  }

  async function uploadFile(file) {
    if (file.size > MAX_UPLOAD_BYTES) {
      note(file.name + " is too large (" + (file.size / 1048576).toFixed(1) + " MB; at most 10 MB); not attached.");
      return;
    }
    const url = "/upload?user=" + encodeURIComponent(userId);
    const headers = { "Content-Type": file.type || "application/octet-stream", "X-File-Name": encodeURIComponent(file.name) };
    try {
      const resp = await fetch(url, { method: "POST", body: file, headers: headers, credentials: "same-origin" });
      const body = await resp.json();
      if (!resp.ok) { note(file.name + ": " + (body.error || "not attached")); return; }
      attached.push({ id: body.id, name: body.name });
      showAttached();
    } catch (e) {
      note(file.name + ": the upload failed; try again.");
    }
  }

  fileEl.addEventListener("change", async () => {
    note("");
    for (const file of Array.from(fileEl.files || [])) await uploadFile(file);
    fileEl.value = "";
  });

  function submit() {
    const text = input.value.trim();
    if (!text && !attached.length) return;
    const why = tooLong(text);
    if (why) { note(why); return; } // the text stays in the box
    note("");
    const files = attached;
    attached = [];
    showAttached();
    const shown = files.length ? (text ? text + "\n\n" : "") + "[attached: " + files.map((a) => a.name).join(", ") + "]" : text;
    const item = { id: randomId(12), text: text, attachments: files.map((a) => a.id) };
    pending.set(item.id, item);
    const entry = { role: "user", id: item.id, text: shown, pending: true };
    if (files.length) { entry.sent = text; entry.attachments = item.attachments; }
    history.push(entry);
    persist();
    show(entry);
    markPending(item.id, true);
    input.value = "";
    transmit(item); // if the socket is down, the hello after reconnecting sends it
  }

  form.addEventListener("submit", (ev) => { ev.preventDefault(); submit(); input.focus(); });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); submit(); }
  });

  connect();
  input.focus();
})();
