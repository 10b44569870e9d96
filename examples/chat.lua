-- A line-based TCP chat across worker processes:
--   moonport -w 2 examples/chat.lua [port]
-- then connect a few clients (e.g. `nc 127.0.0.1 3001`) and type lines.
local mp = require "moonport"

mp.listen {
  port = tonumber(mp.args[1]) or 3001,
  address = "127.0.0.1",
  timeout = 0,
  on_open = function(conn)
    local ip, port = conn:peer()
    conn.env.name = ip .. ":" .. port
    conn.env.buf = ""
    -- Every message on "chat" reaches this client, whichever worker it is on.
    conn:subscribe("chat", function(_, msg)
      conn:write(("[%s] %s\n"):format(msg.from, msg.text))
    end)
    mp.publish("chat", { from = "server", text = conn.env.name .. " joined" })
  end,
  on_data = function(conn, data)
    local buf = conn.env.buf .. data
    for line in buf:gmatch("([^\n]*)\n") do
      mp.publish("chat", { from = conn.env.name, text = line:gsub("\r$", "") })
    end
    conn.env.buf = buf:match("[^\n]*$")
    if #conn.env.buf > 4096 then conn:close() end -- no endless lines
  end,
  on_close = function(conn)
    mp.publish("chat", { from = "server", text = conn.env.name .. " left" })
  end,
}
