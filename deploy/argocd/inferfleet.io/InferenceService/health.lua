-- Argo CD health of an inferfleet.io InferenceService.
--
-- Argo CD runs this in gopher-lua (Lua 5.1) with the object as the global `obj`. Scripts set in
-- argocd-cm get only the base, table and a reduced os library (no string, no math), so this
-- uses nothing else: `..` and tostring for text, ipairs for lists.
--
-- The operator's status: Ready (written with status.observedGeneration by the reconciler:
-- BackendsReady, BackendsNotReady, RouterNotReady, MissingDeployment) and, while
-- `autoscaling.policy: goodput`, MetricsAvailable (written by the autoscaler: MetricsFresh, or
-- why it holds its last decision).

local function find_condition(conditions, condition_type)
  for _, condition in ipairs(conditions) do
    if condition.type == condition_type then
      return condition
    end
  end
  return nil
end

-- What a condition says: its message, else its reason.
local function said(condition)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return condition.reason or condition.type
end

local hs = {}

if obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "InferenceService is being deleted"
  return hs
end

local status = obj.status or {}
local conditions = status.conditions or {}
local ready = find_condition(conditions, "Ready")
if ready == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to report status"
  return hs
end

-- A verdict on an older spec says nothing of this one (new deployments, weights or SLO).
local generation = obj.metadata.generation
local observed = ready.observedGeneration or status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. tostring(generation)
  if observed ~= nil then
    hs.message = hs.message .. " (status is of generation " .. tostring(observed) .. ")"
  end
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = said(ready)
  if status.url ~= nil then
    hs.message = hs.message .. " at " .. status.url
  end
  -- Metrics unavailable while the service is ready: Healthy, with the reason in the message.
  -- The endpoint serves and the autoscaler holds its last decision (it never scales down for
  -- lack of data), so what Git asked for is running. Degraded would turn every autoscaled
  -- Application red, fire its notifications and fail syncs waiting on health whenever
  -- Prometheus is down, for no fault of the service; the shipped alert on stale autoscaler
  -- metrics is the page for that. A condition left from `policy: goodput` is not news once
  -- the policy is `none`.
  local metrics = find_condition(conditions, "MetricsAvailable")
  local autoscaled = obj.spec ~= nil and obj.spec.autoscaling ~= nil
    and obj.spec.autoscaling.policy == "goodput"
  if autoscaled and metrics ~= nil and metrics.status == "False" then
    hs.message = hs.message .. "; autoscaling holds its last decision: " .. said(metrics)
  end
  return hs
end

-- The ModelDeployments behind it are still rolling out (their own health says how far), or
-- its router's pods are starting.
if ready.status == "Unknown" or ready.reason == "BackendsNotReady"
  or ready.reason == "RouterNotReady" then
  hs.status = "Progressing"
  hs.message = said(ready)
  return hs
end

-- MissingDeployment (a name in spec.deployments that does not exist), or a reason this script
-- does not know: shown, not waited on.
hs.status = "Degraded"
hs.message = (ready.reason or "NotReady") .. ": " .. said(ready)
return hs
