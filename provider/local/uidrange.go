package local

// DefaultUIDRange is the block of host uids (and gids, the same numbers)
// sandboxes get one each of: above the ranges distributions give users,
// system services and containers' subordinate ids (systemd leaves
// 0x70000000 and up unassigned), and checked at startup against the host's
// users, groups and /etc/subuid and /etc/subgid.
const DefaultUIDRange = "1879048192-1879113727"

// UIDRangeNone makes every sandbox run as Options.UID and GID.
const UIDRangeNone = "none"
