-- SPDX-License-Identifier: MIT
-- framing = "line" for mp.listen and mp.connect: the bytes of a connection
-- cut into lines, each handed to on_line(conn, line) without its "\n" (or
-- "\r\n"). Written over on_data: lines of one read go to on_line in order,
-- in the read's callback, so an on_line that waits (mp.sleep, r:cmd) holds
-- the lines after it, as any waiting callback holds its connection.
--
-- max_line (bytes, default 8192) bounds what waits for its newline; a
-- connection whose line grows past it gets on_overflow(conn, bytes) if
-- given, and is then closed: the partial line is dropped, never passed on.
-- A last line without a newline at close goes to on_line before on_close
-- (on_close sees the reason as usual).
local find, sub, type, tostring, error = string.find, string.sub, type, tostring, error
local byte = string.byte

local M = {}

local CR = 13

local function check(opts, api)
  if opts.framing ~= "line" then
    error(api .. ": framing must be \"line\" (got " .. tostring(opts.framing) .. ")", 4)
  end
  if type(opts.on_line) ~= "function" then
    error(api .. ": framing = \"line\" needs an on_line function", 4)
  end
  if opts.on_data ~= nil then
    error(api .. ": framing = \"line\" and on_data can't be used together", 4)
  end
  local max = opts.max_line
  if max == nil then max = 8192 end
  if type(max) ~= "number" or max < 1 or max > 2 ^ 30 or max % 1 ~= 0 then
    error(api .. ": max_line must be an integer from 1 to 2^30 (got " .. tostring(max) .. ")", 4)
  end
  return max
end

-- wrap(opts, api): a copy of opts whose on_data and on_close do the
-- framing; api ("mp.listen") names the caller in errors.
function M.wrap(opts, api)
  local max = check(opts, api)
  local on_line, on_close, on_overflow = opts.on_line, opts.on_close, opts.on_overflow
  local pending = {} -- conn -> bytes of an unfinished line

  local function strip(s)
    if byte(s, -1) == CR then return sub(s, 1, -2) end
    return s
  end

  local out = {}
  for k, v in pairs(opts) do out[k] = v end
  out.framing, out.on_line, out.max_line, out.on_overflow = nil, nil, nil, nil

  out.on_data = function(conn, data)
    local head = pending[conn]
    if head then
      data = head .. data
      pending[conn] = nil
    end
    local pos, len = 1, #data
    while pos <= len do
      local nl = find(data, "\n", pos, true)
      if not nl then break end
      if nl - pos > max then break end -- the line itself is too long
      on_line(conn, strip(sub(data, pos, nl - 1)))
      pos = nl + 1
      if not conn:is_open() then return end
    end
    if pos > len then return end
    local rest = sub(data, pos)
    local nl = find(rest, "\n", 1, true)
    if #rest > max and (not nl or nl - 1 > max) then
      if on_overflow then on_overflow(conn, #rest) end
      conn:close()
      return
    end
    pending[conn] = rest
  end

  out.on_close = function(conn, reason)
    local rest = pending[conn]
    if rest then
      pending[conn] = nil
      if rest ~= "" then on_line(conn, strip(rest)) end
    end
    if on_close then return on_close(conn, reason) end
  end
  return out
end

return M
