-- numa_caps N: one worker forked on each of capabilities 0 and 1, each
-- building and folding maps of N keys four times, so both capabilities
-- allocate and lead collections. Run with +RTS -N2 -qa (each capability's
-- thread bound to its CPU) or --numa. Prints a checksum.
import Control.Concurrent
import Control.Exception (evaluate)
import qualified Data.Map.Strict as M
import System.Environment (getArgs)

work :: Int -> Int -> Int
work seed n = M.foldl' (+) 0 (M.fromList [((k * 7919 + seed) `mod` (4 * n), k) | k <- [1 .. n]])

main :: IO ()
main = do
  args <- getArgs
  let n = case args of
        (a : _) -> read a
        [] -> 200000
  results <- mapM (\cap -> do
    done <- newEmptyMVar
    _ <- forkOn cap (evaluate (sum [work (cap * 10 + r) n | r <- [1 .. 4]]) >>= putMVar done)
    return done) [0, 1]
  totals <- mapM takeMVar results
  print (sum totals)
