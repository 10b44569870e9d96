'use strict';
// The chat page: one WebSocket to /ws, opened again after it drops (the
// wait doubles from half a second up to five). Messages are JSON
// { name, text } going out and { name, text, at } coming back.
(function () {
  const list = document.getElementById('messages');
  const form = document.getElementById('form');
  const nameInput = document.getElementById('name');
  const textInput = document.getElementById('text');
  const status = document.getElementById('status');

  nameInput.value = localStorage.getItem('chat-name') || '';
  nameInput.addEventListener('change', () => localStorage.setItem('chat-name', nameInput.value));

  let ws = null;
  let wait = 500;
  let opens = 0;

  function setStatus(text, up) {
    status.textContent = text;
    status.classList.toggle('up', up);
    document.body.dataset.connected = up ? 'yes' : 'no';
  }

  function show(msg) {
    const li = document.createElement('li');
    if (msg.system) {
      li.className = 'system';
      li.textContent = msg.text;
      list.append(li);
      return;
    }
    const who = document.createElement('span');
    who.className = 'who';
    who.textContent = msg.name + ':';
    const text = document.createElement('span');
    text.className = 'text';
    text.textContent = msg.text;
    li.append(who, text);
    if (msg.at) {
      const when = document.createElement('span');
      when.className = 'when';
      when.textContent = new Date(msg.at * 1000).toLocaleTimeString();
      li.append(when);
    }
    const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
    list.append(li);
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  function connect() {
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const sock = new WebSocket(scheme + '//' + location.host + '/ws');
    ws = sock;
    sock.onopen = () => {
      wait = 500;
      document.body.dataset.opens = String(++opens);
      setStatus('connected', true);
    };
    sock.onmessage = (ev) => {
      try { show(JSON.parse(ev.data)); } catch (e) { /* not a chat line */ }
    };
    sock.onclose = () => {
      if (ws !== sock) return;
      setStatus('disconnected; trying again in ' + (wait / 1000) + ' s', false);
      setTimeout(connect, wait);
      wait = Math.min(wait * 2, 5000);
    };
  }

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = textInput.value.trim();
    if (!text) return;
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      setStatus('not connected; your message is still in the box', false);
      return;
    }
    localStorage.setItem('chat-name', nameInput.value);
    ws.send(JSON.stringify({ name: nameInput.value.trim() || 'anonymous', text }));
    textInput.value = '';
    textInput.focus();
  });

  setStatus('connecting…', false);
  connect();
}());
