-- SPDX-License-Identifier: MIT
-- Pub/sub fan-out server for the benchmark harness (scripts/bench-pubsub,
-- load tool bench/pubsub_load.c).
-- usage: moonport -w 2 bench/pubsub.lua [port [channel]]
--        (port defaults to 3002, channel to "bench")
--
-- A line protocol, one command per line:
--   "sub\n"        subscribe this connection to the channel; every message
--                  published there is then written to it as it is. Replies
--                  "ok W L\n" (W = mp.worker(), L = mp.lane()) once the
--                  subscription is in place.
--   "pub <text>\n" mp.publish(channel, "<text>\n") (default scope: cluster,
--                  so the subscribers of every worker get it). The message
--                  keeps its newline, so a subscriber's callback writes it
--                  with no concatenation.
--   "who\n"        replies "me W L\n" (which worker and lane serve it).
-- Anything else closes the connection.
local mp = require "moonport"

local channel = mp.args[2] or "bench"
local publish = mp.publish
local find, sub, byte = string.find, string.sub, string.byte

local function deliver_to(conn)
  return function(_, msg)
    conn:write(msg)
  end
end

mp.listen {
  port = tonumber(mp.args[1]) or 3002,
  address = "127.0.0.1",
  timeout = 0,
  on_data = function(conn, data)
    local env = conn.env
    local buf = env.buf
    if buf then buf = buf .. data else buf = data end
    local pos, len = 1, #buf
    while pos <= len do
      local nl = find(buf, "\n", pos, true)
      if not nl then break end
      if byte(buf, pos) == 112 and sub(buf, pos, pos + 3) == "pub " then -- 'p'
        publish(channel, sub(buf, pos + 4, nl))
      else
        local line = sub(buf, pos, nl - 1)
        if line == "sub" then
          if not env.sub then
            env.sub = conn:subscribe(channel, deliver_to(conn))
          end
          conn:write(("ok %d %d\n"):format(mp.worker(), mp.lane()))
        elseif line == "who" then
          conn:write(("me %d %d\n"):format(mp.worker(), mp.lane()))
        else
          conn:close()
          return
        end
      end
      pos = nl + 1
    end
    if pos > len then
      env.buf = nil
    else
      env.buf = sub(buf, pos)
      if #env.buf > 65536 then conn:close() end -- no endless lines
    end
  end,
}
