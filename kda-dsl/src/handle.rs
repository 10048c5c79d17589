//! Typed handles into arenas (naga's `Handle<T>`/`Arena<T>` is the model): a kernel's
//! parameters, buffers and variables each live in an [`Arena`], and an [`Id`] of one kind
//! cannot index another, nor be mistaken for a plain number.
//!
//! ```compile_fail
//! use kda_dsl::tile::{BufId, VarId};
//! fn takes_var(_: VarId) {}
//! fn give(b: BufId) {
//!     takes_var(b); // a buffer handle is not a variable handle
//! }
//! ```
//!
//! The same with the right handle compiles (so the failure above is the mismatch):
//!
//! ```
//! use kda_dsl::tile::{BufId, VarId};
//! fn takes_var(_: VarId) {}
//! fn give(v: VarId, _b: BufId) {
//!     takes_var(v);
//! }
//! ```

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// A handle to a `T` in an [`Arena<T>`] (or a row of an [`IdVec<T, _>`]).
pub struct Id<T> {
    index: u32,
    kind: PhantomData<fn() -> T>,
}

impl<T> Id<T> {
    /// The handle of the `index`-th item (arenas number their items in order).
    pub fn new(index: usize) -> Self {
        Id { index: u32::try_from(index).expect("fewer than 2^32 items"), kind: PhantomData }
    }

    /// The item's position in its arena.
    pub fn index(self) -> usize {
        self.index as usize
    }
}

impl<T> Clone for Id<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Id<T> {}
impl<T> PartialEq for Id<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index
    }
}
impl<T> Eq for Id<T> {}
impl<T> PartialOrd for Id<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Id<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.index.cmp(&other.index)
    }
}
impl<T> Hash for Id<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.index.hash(state)
    }
}
impl<T> fmt::Debug for Id<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.index)
    }
}
impl<T> fmt::Display for Id<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.index)
    }
}

/// Items of one kind, in insertion order, indexed by their [`Id`]s.
#[derive(Clone, PartialEq)]
pub struct Arena<T> {
    items: Vec<T>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena { items: vec![] }
    }
}

impl<T: fmt::Debug> fmt::Debug for Arena<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.items.fmt(f)
    }
}

impl<T> Arena<T> {
    /// An empty arena.
    pub fn new() -> Self {
        Arena { items: vec![] }
    }

    /// Adds `item`; its handle.
    pub fn push(&mut self, item: T) -> Id<T> {
        self.items.push(item);
        Id::new(self.items.len() - 1)
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    /// The items with their handles, in order.
    pub fn iter_ids(&self) -> impl Iterator<Item = (Id<T>, &T)> {
        self.items.iter().enumerate().map(|(i, t)| (Id::new(i), t))
    }

    /// The handle of the first item `f` accepts.
    pub fn position(&self, f: impl FnMut(&T) -> bool) -> Option<Id<T>> {
        self.items.iter().position(f).map(Id::new)
    }

    /// The item of `id`, if this arena has it.
    pub fn get(&self, id: Id<T>) -> Option<&T> {
        self.items.get(id.index())
    }
}

impl<'a, T> IntoIterator for &'a Arena<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<T> Index<Id<T>> for Arena<T> {
    type Output = T;
    fn index(&self, id: Id<T>) -> &T {
        &self.items[id.index()]
    }
}

impl<T> IndexMut<Id<T>> for Arena<T> {
    fn index_mut(&mut self, id: Id<T>) -> &mut T {
        &mut self.items[id.index()]
    }
}

/// A value per item of an `Arena<T>` (a side table a pass or the lowering keeps), indexed by
/// the items' [`Id`]s.
#[derive(Clone, PartialEq)]
pub struct IdVec<T, V> {
    values: Vec<V>,
    kind: PhantomData<fn() -> T>,
}

impl<T, V: fmt::Debug> fmt::Debug for IdVec<T, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.values.fmt(f)
    }
}

impl<T, V: Clone> IdVec<T, V> {
    /// `n` copies of `v`.
    pub fn filled(n: usize, v: V) -> Self {
        IdVec { values: vec![v; n], kind: PhantomData }
    }
}

impl<T, V> IdVec<T, V> {
    /// The values with their items' handles, in order.
    pub fn iter_ids(&self) -> impl Iterator<Item = (Id<T>, &V)> {
        self.values.iter().enumerate().map(|(i, v)| (Id::new(i), v))
    }

    /// The values, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, V> {
        self.values.iter()
    }
}

impl<T, V> FromIterator<V> for IdVec<T, V> {
    fn from_iter<I: IntoIterator<Item = V>>(iter: I) -> Self {
        IdVec { values: iter.into_iter().collect(), kind: PhantomData }
    }
}

impl<T, V> IntoIterator for IdVec<T, V> {
    type Item = V;
    type IntoIter = std::vec::IntoIter<V>;
    fn into_iter(self) -> Self::IntoIter {
        self.values.into_iter()
    }
}

impl<T, V> Index<Id<T>> for IdVec<T, V> {
    type Output = V;
    fn index(&self, id: Id<T>) -> &V {
        &self.values[id.index()]
    }
}

impl<T, V> IndexMut<Id<T>> for IdVec<T, V> {
    fn index_mut(&mut self, id: Id<T>) -> &mut V {
        &mut self.values[id.index()]
    }
}
