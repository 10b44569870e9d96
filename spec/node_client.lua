-- The methods both pub/sub specs' clients share (spec/e2e/pubsub_spec.lua and
-- spec/e2e/redis_spec.lua talk to spec/fixtures/pubsub_node.lua): reading,
-- waiting, the request/reply commands and collecting deliveries. Each spec
-- keeps its own _parse, reply and cmd (what it records differs).
-- Usage: require("spec.node_client")(Client)
local H = require "spec.helper"
local assert = require "luassert"

local Client = {}

-- Reads what arrives before `deadline`; false once nothing more came.
function Client:_fill(deadline)
  local rem = deadline - H.now()
  if rem <= 0 or self.closed then return false end
  local data, err = H.read_some(self.c, rem)
  if data then
    self.buf = self.buf .. data
    self:_parse()
    return true
  end
  if err ~= "timeout" then self.closed = err end
  return false
end

function Client:wait(pred, timeout, what)
  local deadline = H.now() + (timeout or H.T(5))
  while not pred() do
    if not self:_fill(deadline) and not pred() and (self.closed or H.now() >= deadline) then
      error(("%s: %s while waiting for %s\n%s"):format(self.name,
        self.closed and ("connection " .. self.closed) or "timed out",
        type(what) == "function" and what() or what, self.node:describe()), 0)
    end
  end
end

function Client:send(data)
  local ok, err = H.send(self.c, data, H.T(10))
  assert(ok, self.name .. ": send failed: " .. tostring(err))
end

function Client:expect_reply(line, want, timeout)
  assert.equal(want, self:cmd(line, timeout), self.name .. ": reply to " .. line:sub(1, 80))
end

function Client:sub(label, flags, ch)
  self:expect_reply(("sub %s %s %s"):format(label, flags, ch), "ok sub " .. label)
end

function Client:pub(scope, ch, text)
  self:expect_reply(("pub %s %s %s"):format(scope, ch, text or ""), "ok pub")
end

function Client:pubraw(scope, ch, msg)
  self:send(("pubraw %s %d %d\n"):format(scope, #ch, #msg) .. ch .. msg)
  assert.equal("ok pub", self:reply(H.T(10)), self.name .. ": pubraw")
end

function Client:collect(n, timeout)
  self:wait(function() return #self.deliveries >= n end, timeout, function()
    return ("%d deliveries (have %d)"):format(n, #self.deliveries)
  end)
  local got = {}
  for i = 1, n do got[i] = table.remove(self.deliveries, 1) end
  return got
end

return function(class)
  for k, v in pairs(Client) do class[k] = v end
  return class
end
