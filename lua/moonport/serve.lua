-- SPDX-License-Identifier: MIT
-- mp.listen { on_connect = function(sock) ... end }: the cosocket style for
-- servers. Each accepted connection is an mp.tcp socket (lua/moonport/
-- tcp.lua: receive, receiveuntil, send, settimeouts, close, and peer, uid)
-- handed to on_connect in a coroutine of its own (src/lx/lx_tcp.c,
-- lx_tcp_server_proto). When on_connect returns the socket closes, after
-- its queued bytes are sent; when it raises, the error is logged and only
-- that connection closes.
local type, tostring, error, pairs = type, tostring, error, pairs
local xpcall, traceback = xpcall, debug.traceback

local M = {}

-- Handlers of the callback style that can't go with on_connect: the
-- socket reads the connection itself.
local callbacks = { "on_open", "on_data", "on_ready", "on_timeout", "on_shutdown", "on_close",
  "on_line" }

local function limit(opts, name)
  local v = opts[name]
  if v == nil then return end
  if type(v) ~= "number" or v < 1 or v > 2 ^ 30 or v % 1 ~= 0 then
    error("mp.listen: " .. name .. " must be an integer from 1 to 2^30 (got " .. tostring(v) .. ")", 4)
  end
end

-- wrap(opts): a copy of opts whose on_connect closes its socket at the end.
function M.wrap(opts)
  local fn = opts.on_connect
  if type(fn) ~= "function" then
    error("mp.listen: on_connect must be a function (got " .. type(fn) .. ")", 3)
  end
  for _, name in pairs(callbacks) do
    if opts[name] ~= nil then
      error("mp.listen: on_connect and " .. name .. " can't be used together", 3)
    end
  end
  if opts.framing ~= nil then error("mp.listen: on_connect and framing can't be used together", 3) end
  limit(opts, "max_buffer")
  limit(opts, "max_line")
  local out = {}
  for k, v in pairs(opts) do out[k] = v end
  out.on_connect = function(sock)
    local ok, err = xpcall(fn, traceback, sock)
    sock:close()
    if not ok then error(err, 0) end
  end
  return out
end

return M
