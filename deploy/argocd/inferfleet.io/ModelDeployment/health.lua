-- Argo CD health of an inferfleet.io ModelDeployment.
--
-- Argo CD runs this in gopher-lua (Lua 5.1) with the object as the global `obj`. Scripts set in
-- argocd-cm get only the base, table and a reduced os library (no string, no math), so this
-- uses nothing else: `..` and tostring for text, ipairs for lists.
--
-- The operator's status (operator/inferfleet/reconcile/status.py): conditions Ready (the
-- summary), Fits, Progressing and Degraded, each with observedGeneration; roles[] with
-- desired, ready and pinned; autoscaling when an InferenceService sets the replicas.

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

-- Who holds the replicas other than the spec: an SRE pin, or an InferenceService's autoscaler.
local function replica_notes(status)
  local notes = ""
  local pinned = {}
  for _, role in ipairs(status.roles or {}) do
    if role.pinned then
      table.insert(pinned, role.role .. "=" .. tostring(role.desired))
    end
  end
  if #pinned > 0 then
    notes = notes .. "; pinned by inferfleet.io/pin: " .. table.concat(pinned, ", ")
  end
  if status.autoscaling ~= nil and status.autoscaling.service ~= nil then
    notes = notes .. "; replicas set by InferenceService " .. status.autoscaling.service
    if status.autoscaling.reason ~= nil then
      notes = notes .. " (" .. status.autoscaling.reason .. ")"
    end
  end
  return notes
end

local hs = {}

if obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "ModelDeployment is being deleted"
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

-- A verdict on an older spec says nothing of this one. Ready carries the generation it judged
-- (the operator writes it even when it refuses a spec and leaves the rest of the status be).
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

-- Does not fit: no retry can help, only a new spec (more GPUs, lower precision, shorter context).
local fits = find_condition(conditions, "Fits")
if fits ~= nil and fits.status == "False" then
  hs.status = "Degraded"
  hs.message = said(fits)
  return hs
end

local refused = ready.reason == "InvalidSpec" or ready.reason == "SpecNotApplied"
if ready.status == "False" and refused then
  hs.status = "Degraded"
  hs.message = said(ready)
  return hs
end

-- A rollout past its progress deadline (image pulls, crash loops, no GPU node to schedule on).
local degraded = find_condition(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = said(degraded)
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = said(ready) .. replica_notes(status)
  return hs
end

local progressing = find_condition(conditions, "Progressing")
local rolling = progressing ~= nil and progressing.status == "True"
if ready.status == "Unknown" or ready.reason == "ReplicasNotReady" or rolling then
  hs.status = "Progressing"
  hs.message = said(ready) .. replica_notes(status)
  return hs
end

-- Not ready for a reason this script does not know: show it rather than wait on it.
hs.status = "Degraded"
hs.message = (ready.reason or "NotReady") .. ": " .. said(ready)
return hs
