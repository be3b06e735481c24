//! Fair shares of the shards among live replicas: pure decisions, so they
//! are tested without an API server.

use std::collections::BTreeMap;

/// What one replica should do with the shards this turn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Free shards to try to acquire, in preference order.
    pub acquire: Vec<u32>,
    /// A held shard to hand back, so a replica below its share can take it.
    pub give_up: Option<u32>,
}

/// The view a replica has of the shards and of the live replicas.
#[derive(Clone, Debug)]
pub struct View<'a> {
    /// K, the number of shards to share out.
    pub shard_count: u32,
    /// The identity of the replica that decides (its member Lease holder).
    pub me: &'a str,
    /// Live replicas (this one included), each with the shards it holds.
    pub members: BTreeMap<&'a str, Vec<u32>>,
    /// Shards nobody holds (never acquired, released, or expired).
    pub free: Vec<u32>,
}

/// The least and most shards a replica should hold among `live` replicas.
pub fn fair_share(shard_count: u32, live: usize) -> (usize, usize) {
    let k = shard_count as usize;
    let n = live.max(1);
    (k / n, k.div_ceil(n))
}

/// Decides the turn: take free shards up to the ceiling of the fair share;
/// when another live replica is below the floor and this one is above it,
/// give one back. Each replica ends within one shard of K / live.
pub fn plan(view: &View<'_>) -> Plan {
    let live = view.members.len().max(1);
    let (floor, ceil) = fair_share(view.shard_count, live);
    let held = view.members.get(view.me).map_or(0, Vec::len);
    let mut plan = Plan::default();
    if held < ceil {
        // Replicas start their preference at different points of the ring,
        // so several acquiring at once rarely reach for the same Lease.
        let rank = view.members.keys().position(|m| *m == view.me).unwrap_or(0);
        let start = (rank * view.shard_count as usize / live) as u32;
        let mut free = view.free.clone();
        free.sort_by_key(|s| {
            (s + view.shard_count - start % view.shard_count.max(1)) % view.shard_count.max(1)
        });
        plan.acquire = free.into_iter().take(ceil - held).collect();
    }
    let starving = view
        .members
        .iter()
        .any(|(name, shards)| *name != view.me && shards.len() < floor);
    if starving && held > floor && view.free.is_empty() {
        plan.give_up = view
            .members
            .get(view.me)
            .and_then(|shards| shards.iter().max().copied());
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(me: &'a str, k: u32, members: &[(&'a str, Vec<u32>)]) -> View<'a> {
        let members: BTreeMap<&str, Vec<u32>> = members.iter().cloned().collect();
        let held: Vec<u32> = members.values().flatten().copied().collect();
        let free = (0..k).filter(|s| !held.contains(s)).collect();
        View {
            shard_count: k,
            me,
            members,
            free,
        }
    }

    /// Runs every replica's plan in turns, each seeing the others' moves,
    /// until nothing changes; returns the holdings.
    fn converge(k: u32, names: &[&str], start: &[(&str, Vec<u32>)]) -> BTreeMap<String, Vec<u32>> {
        let mut holdings: BTreeMap<String, Vec<u32>> = names
            .iter()
            .map(|n| ((*n).to_owned(), Vec::new()))
            .collect();
        for (n, s) in start {
            holdings.insert((*n).to_owned(), s.clone());
        }
        for _ in 0..100 {
            let mut changed = false;
            for me in names {
                let members: Vec<(&str, Vec<u32>)> = holdings
                    .iter()
                    .map(|(n, s)| (n.as_str(), s.clone()))
                    .collect();
                let p = plan(&view(me, k, &members));
                let held = holdings.get_mut(*me).expect("member");
                if let Some(s) = p.give_up {
                    held.retain(|x| *x != s);
                    changed = true;
                }
                for s in p.acquire {
                    held.push(s);
                    changed = true;
                }
            }
            if !changed {
                return holdings;
            }
        }
        panic!("no convergence: {holdings:?}");
    }

    fn assert_fair(k: u32, holdings: &BTreeMap<String, Vec<u32>>) {
        let (floor, ceil) = fair_share(k, holdings.len());
        let mut all: Vec<u32> = holdings.values().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..k).collect::<Vec<_>>(),
            "every shard held exactly once"
        );
        for (name, shards) in holdings {
            assert!(
                (floor..=ceil).contains(&shards.len()),
                "{name} holds {} of {k}: {holdings:?}",
                shards.len()
            );
        }
    }

    #[test]
    fn fair_share_is_floor_and_ceiling() {
        assert_eq!(fair_share(16, 3), (5, 6));
        assert_eq!(fair_share(16, 4), (4, 4));
        assert_eq!(fair_share(16, 0), (16, 16));
        assert_eq!(fair_share(2, 3), (0, 1));
    }

    #[test]
    fn replicas_starting_together_split_the_shards_fairly() {
        for n in 1..=7 {
            let names: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            assert_fair(16, &converge(16, &names, &[]));
        }
    }

    #[test]
    fn a_joining_replica_gets_its_share_from_the_others() {
        let start = [
            ("a", (0..6).collect()),
            ("b", (6..11).collect()),
            ("c", (11..16).collect()),
        ];
        let holdings = converge(16, &["a", "b", "c", "d"], &start);
        assert_fair(16, &holdings);
        assert_eq!(holdings["d"].len(), 4);
    }

    #[test]
    fn the_shards_of_a_departed_replica_are_taken_by_the_rest() {
        // "c" is gone: its shards are free and the two others take them.
        let start = [("a", (0..6).collect()), ("b", (6..11).collect())];
        assert_fair(16, &converge(16, &["a", "b"], &start));
    }

    #[test]
    fn a_replica_at_its_share_gives_nothing_up() {
        let v = view(
            "a",
            16,
            &[
                ("a", (0..6).collect()),
                ("b", (6..11).collect()),
                ("c", (11..16).collect()),
            ],
        );
        assert_eq!(plan(&v), Plan::default());
    }

    #[test]
    fn only_one_shard_is_given_up_per_turn_and_only_to_a_starving_replica() {
        let v = view(
            "a",
            16,
            &[
                ("a", (0..8).collect()),
                ("b", (8..16).collect()),
                ("c", vec![]),
            ],
        );
        let p = plan(&v);
        assert_eq!(p.give_up, Some(7));
        assert!(p.acquire.is_empty());
        // With free shards left, the starving replica takes those first.
        let v = view(
            "a",
            16,
            &[("a", (0..8).collect()), ("b", vec![]), ("c", vec![])],
        );
        assert_eq!(plan(&v).give_up, None);
    }
}
