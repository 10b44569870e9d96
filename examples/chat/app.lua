-- A browser chat over WebSocket, across worker processes:
--   moonport -w 2 examples/chat/app.lua [port [cert.pem key.pem]]
-- (port: 3000) then open http://127.0.0.1:3000/ in two browser tabs; with a
-- certificate and its key (PEM files), the page and its socket are served
-- over TLS instead: https://127.0.0.1:3000/ and wss://.
--
-- Every socket subscribes to the channel "chat" with no Lua callback, so a
-- message published there goes to each client as a frame straight from C;
-- mp.publish reaches the subscribers of every worker process.
local mp = require "moonport"
local cjson = require "cjson"

-- The folder of this script, so the page is found from any directory.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"

local files = {
  ["/"] = { "index.html", "text/html; charset=utf-8" },
  ["/chat.js"] = { "chat.js", "text/javascript; charset=utf-8" },
  ["/chat.css"] = { "chat.css", "text/css; charset=utf-8" },
}

-- s cut to at most n bytes without splitting a UTF-8 character (a string
-- that is not UTF-8 would go out as a binary frame).
local function cut(s, n)
  if #s <= n then return s end
  while n > 0 and s:byte(n + 1) >= 0x80 and s:byte(n + 1) < 0xC0 do n = n - 1 end
  return s:sub(1, n)
end

-- A chat line from a client, as JSON { name, text }; nil if it isn't one.
local function parse(data)
  local ok, msg = pcall(cjson.decode, data)
  if not ok or type(msg) ~= "table" then return nil end
  local name, text = msg.name, msg.text
  if type(name) ~= "string" or type(text) ~= "string" then return nil end
  name = name:gsub("%s+", " "):match("^%s*(.-)%s*$")
  text = text:match("^%s*(.-)%s*$")
  if text == "" or #text > 8000 then return nil end
  if name == "" then name = "anonymous" end
  return { name = cut(name, 120), text = text, at = os.time() }
end

local cert, key = mp.args[2], mp.args[3]
if cert and not key then error("give the certificate and its key: app.lua PORT CERT KEY", 0) end

mp.http {
  port = tonumber(mp.args[1]) or 3000,
  address = "127.0.0.1",
  tls = cert and { cert = cert, key = key } or nil,
  on_request = function(req, res)
    local f = files[req.path]
    if not f then return res:status(404):send("not found\n") end
    res:header("Content-Type", f[2]):header("Cache-Control", "no-cache")
    res:sendfile(here .. f[1])
  end,
  compress = true, -- the page, its script and style: gzip or br
  websocket = {
    max_msg = 16384,
    -- permessage-deflate with browsers (all offer it); the server deflates
    -- each published message once for every subscriber
    compress = true,
    on_open = function(ws, req)
      if req.path ~= "/ws" then return ws:close(1008, "the chat is at /ws") end
      ws:subscribe("chat")
      -- to this client only: where it landed (with -w 2, tabs land on
      -- different workers and still see each other's messages)
      ws:send(cjson.encode { system = true, text = mp.workers() > 1
        and ("connected to worker %d of %d"):format(mp.worker(), mp.workers())
        or "connected" })
    end,
    on_message = function(ws, data, is_text)
      local msg = is_text and parse(data)
      if not msg then return ws:close(1003, "send JSON { name, text }") end
      mp.publish("chat", cjson.encode(msg))
    end,
  },
}
