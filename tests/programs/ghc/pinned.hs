-- The Well-Typed field report's program (../shared/seeds/000): a list of n
-- one-byte ByteStrings (each in pinned memory), then a tenth of them kept,
-- either every 10th ("strip": one survivor per stretch of pinned block, so
-- no pinned block can go) or the first tenth ("take": whole blocks survive,
-- the rest can be returned). Each phase spins through major GCs so the
-- eventlog and RSS samples show a plateau.
--
-- Usage: pinned strip|take N
{-# LANGUAGE BangPatterns #-}
import Control.Concurrent (threadDelay)
import Control.DeepSeq (force)
import Control.Monad (forM_)
import qualified Data.ByteString as BS
import System.Environment (getArgs)
import System.IO (hFlush, stdout)
import System.Mem (performGC)

main :: IO ()
main = do
  [variant, count] <- getArgs
  let n = read count :: Int
  let !superset = force $ take n [BS.singleton x | x <- cycle [minBound .. maxBound]]
  putStrLn "1st plateau" >> hFlush stdout
  spin 4
  let !subset = force $ case variant of
        "strip" -> [x | (x, 1) <- zip superset (cycle [1 .. 10 :: Int])]
        "take" -> take (n `div` 10) superset
        _ -> error "variant: strip or take"
  putStrLn "2nd plateau" >> hFlush stdout
  spin 40
  print (length subset)

-- A major GC every 20 ms.
spin :: Int -> IO ()
spin i = forM_ [1 .. i] (\_ -> threadDelay 20000 >> performGC)
